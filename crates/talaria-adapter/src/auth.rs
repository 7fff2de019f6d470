//! Who may talk to the bot: allow-all flags, allowlists and the pairing
//! store's approvals, evaluated in one fixed order.
//!
//! This is pure policy. The caller looks up whether the sender is paired,
//! calls [`AuthPolicy::decide`] and acts on the [`Decision`] (drop the
//! message, offer a pairing code). Keeping I/O out makes every rule
//! testable from a table.
//!
//! # Configuration
//!
//! For a platform `p` the variables are named after `P`, the platform name
//! upper-cased with anything but letters and digits turned into `_`
//! (`whatsapp_cloud` → `WHATSAPP_CLOUD`):
//!
//! - `<P>_ALLOW_ALL_USERS`: `true`, `1` or `yes` (any case) lets every
//!   user of that platform in.
//! - `<P>_ALLOWED_USERS`: comma-separated user ids; `*` means everyone.
//! - `GATEWAY_ALLOWED_USERS`: the same, for every platform.
//! - `GATEWAY_ALLOW_ALL_USERS`: lets everyone in, but only while no
//!   allowlist applies to the message; one configured list switches it off.
//! - `<P>_GROUP_ALLOWED_CHATS`, on platforms whose adapter declares
//!   [`Capabilities::group_chat_allowlist`] (Telegram): group, forum and
//!   channel chat ids (or `*`) in which every message is accepted,
//!   anonymous ones too.
//!
//! Ids are compared exactly (after trimming list entries); where the
//! adapter declares [`crate::SenderIds::Email`] or [`crate::SenderIds::Nick`],
//! case-insensitively. Unlike the system this one descends
//! from, an entry `alice` does not admit `alice@anywhere`: a local part is
//! not an identity.

use std::fmt;

use talaria_core::Env;

use crate::capabilities::Capabilities;
use crate::event::{ChatType, SessionSource};

/// Which rule let a message in; for logs and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The chat is on `TELEGRAM_GROUP_ALLOWED_CHATS` (by id or `*`).
    GroupChat,
    /// `<P>_ALLOW_ALL_USERS` is set.
    PlatformAllowAll,
    /// The operator approved the sender's pairing code.
    Paired,
    /// `GATEWAY_ALLOW_ALL_USERS` is set and no allowlist applies.
    GlobalAllowAll,
    /// An applicable allowlist contains `*`.
    Wildcard,
    /// The sender's id is on `<P>_ALLOWED_USERS` or `GATEWAY_ALLOWED_USERS`.
    Allowlisted,
}

impl Reason {
    /// A short stable name for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::GroupChat => "group_chat",
            Reason::PlatformAllowAll => "platform_allow_all",
            Reason::Paired => "paired",
            Reason::GlobalAllowAll => "global_allow_all",
            Reason::Wildcard => "wildcard",
            Reason::Allowlisted => "allowlisted",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of [`AuthPolicy::decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decision {
    /// Handle the message.
    Allow(Reason),
    /// Drop the message.
    Deny {
        /// Whether the sender should be offered a pairing code: only in a
        /// DM, only to a human, only on a platform with no user allowlist
        /// (an operator who wrote a list has said who may talk) and never
        /// by e-mail (any address can write, so codes would go to spammers).
        offer_pairing: bool,
    },
}

impl Decision {
    /// Whether the message may be handled.
    pub fn is_allowed(self) -> bool {
        matches!(self, Decision::Allow(_))
    }
}

/// The authorization rules read from the environment.
///
/// Platforms are open-ended (adapters may be added without touching this
/// module), so variables are looked up per message for the message's
/// platform rather than pre-read for a fixed list.
#[derive(Clone)]
pub struct AuthPolicy {
    env: Env,
}

// Hand-written so that printing a policy (or a struct holding one) never
// prints the environment snapshot, which also holds API keys.
impl fmt::Debug for AuthPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthPolicy")
            .field(
                "gateway_allow_all_users",
                &self.flag("GATEWAY_ALLOW_ALL_USERS"),
            )
            .field("gateway_allowed_users", &self.list("GATEWAY_ALLOWED_USERS"))
            .finish_non_exhaustive()
    }
}

const GLOBAL_LIST_KEY: &str = "GATEWAY_ALLOWED_USERS";
const GLOBAL_ALLOW_ALL_KEY: &str = "GATEWAY_ALLOW_ALL_USERS";

impl AuthPolicy {
    /// A policy over a snapshot of `env`; later changes to the environment
    /// need a new policy.
    pub fn from_env(env: &Env) -> AuthPolicy {
        AuthPolicy { env: env.clone() }
    }

    /// Decides whether the message from `source` may be handled. `caps`
    /// are the source platform's; `paired` says whether the pairing store
    /// holds an approval for this sender on this platform (the caller looks
    /// it up).
    pub fn decide(&self, source: &SessionSource, caps: &Capabilities, paired: bool) -> Decision {
        self.walk(source, caps, paired, &mut |_| {})
    }

    /// [`AuthPolicy::decide`], with a sentence for every rule it looked at
    /// in the order it looked (`talaria doctor auth`): what the rule reads
    /// and whether it decided.
    pub fn explain(
        &self,
        source: &SessionSource,
        caps: &Capabilities,
        paired: bool,
    ) -> (Decision, Vec<String>) {
        let mut steps = Vec::new();
        let decision = self.walk(source, caps, paired, &mut |step| {
            steps.push(step.to_string());
        });
        (decision, steps)
    }

    /// The rules in their fixed order. `note` hears each rule's finding;
    /// `decide` passes a closure that drops them, and `format_args!` is
    /// lazy, so the sentences are only written out when explained.
    fn walk(
        &self,
        source: &SessionSource,
        caps: &Capabilities,
        paired: bool,
        note: &mut dyn FnMut(fmt::Arguments<'_>),
    ) -> Decision {
        let platform = source.platform.to_ascii_lowercase();
        let caseless = caps.sender_ids.caseless();
        // Variable names for the sentences, spelled only if one is written.
        let group_var = VarName(&platform, "GROUP_ALLOWED_CHATS");
        let users_var = VarName(&platform, "ALLOWED_USERS");
        let all_var = VarName(&platform, "ALLOW_ALL_USERS");

        // Checked before the sender because channel posts and anonymous
        // group admins carry no usable user id, and Telegram shows the
        // latter as a bot; the operator vouched for the whole chat.
        let group_chats = if caps.group_chat_allowlist && is_group_scoped(source.chat_type) {
            self.list(&talaria_core::config::platform_var(
                &platform,
                "GROUP_ALLOWED_CHATS",
            ))
        } else {
            Vec::new()
        };
        if !caps.group_chat_allowlist {
            note(format_args!(
                "chat allowlist: {platform} has none (only user ids decide)"
            ));
        } else if !is_group_scoped(source.chat_type) {
            note(format_args!(
                "chat allowlist: {group_var} applies to group chats, this is a {}",
                source.chat_type
            ));
        } else if !source.chat_id.is_empty()
            && group_chats
                .iter()
                .any(|c| *c == "*" || *c == source.chat_id)
        {
            note(format_args!(
                "chat allowlist: chat {} is on {group_var}: let in",
                source.chat_id
            ));
            return Decision::Allow(Reason::GroupChat);
        } else {
            note(format_args!(
                "chat allowlist: chat {} is not on {group_var} ({})",
                source.chat_id,
                shown_list(&group_chats)
            ));
        }

        let Some(user) = source.user_id.as_deref().filter(|u| !u.trim().is_empty()) else {
            note(format_args!(
                "sender: the message carries no user id, so no user rule can let it in: kept out"
            ));
            return Decision::Deny {
                offer_pairing: false,
            };
        };

        let mut users = self.platform_list(&platform, "ALLOWED_USERS");
        users.extend(self.list(GLOBAL_LIST_KEY));
        let listed = |e: &&str| {
            if caseless {
                e.to_lowercase() == user.to_lowercase()
            } else {
                *e == user
            }
        };

        // Bots (including other agents) are not users: allow-all flags,
        // pairing and `*` are about people, so a bot needs its own entry.
        if source.is_bot {
            return if users.iter().any(listed) {
                note(format_args!(
                    "bot: {user} is a bot, named on {users_var} or {GLOBAL_LIST_KEY}: let in"
                ));
                Decision::Allow(Reason::Allowlisted)
            } else {
                note(format_args!(
                    "bot: {user} is a bot; bots need their own id on {users_var} or \
                     {GLOBAL_LIST_KEY} (allow-all, `*` and pairing are for people): kept out"
                ));
                Decision::Deny {
                    offer_pairing: false,
                }
            };
        }

        let deny = Decision::Deny {
            offer_pairing: source.chat_type == ChatType::Dm
                && users.is_empty()
                && caps.offers_pairing(),
        };

        if self.platform_flag(&platform, "ALLOW_ALL_USERS") {
            note(format_args!("{all_var} is set: let in"));
            return Decision::Allow(Reason::PlatformAllowAll);
        }
        note(format_args!("{all_var} is not set"));
        if paired {
            note(format_args!(
                "pairing: {user} was approved on {platform}: let in"
            ));
            return Decision::Allow(Reason::Paired);
        }
        note(format_args!(
            "pairing: {user} has no approval on {platform}"
        ));
        if users.is_empty() && group_chats.is_empty() {
            // Any applicable list switches the global flag off, so adding
            // one user to a list can never widen access.
            return if self.flag(GLOBAL_ALLOW_ALL_KEY) {
                note(format_args!(
                    "no allowlist applies and {GLOBAL_ALLOW_ALL_KEY} is set: let in"
                ));
                Decision::Allow(Reason::GlobalAllowAll)
            } else {
                note(format_args!(
                    "no allowlist applies ({users_var} and {GLOBAL_LIST_KEY} are empty) and \
                     {GLOBAL_ALLOW_ALL_KEY} is not set: kept out"
                ));
                deny
            };
        }
        note(format_args!(
            "{GLOBAL_ALLOW_ALL_KEY} does not count: an allowlist applies"
        ));
        if users.contains(&"*") {
            note(format_args!("allowlist: it holds `*`: let in"));
            return Decision::Allow(Reason::Wildcard);
        }
        if users.iter().any(listed) {
            note(format_args!(
                "allowlist: {user} is on {users_var} or {GLOBAL_LIST_KEY}: let in"
            ));
            return Decision::Allow(Reason::Allowlisted);
        }
        note(format_args!(
            "allowlist: {user} is not on {users_var} or {GLOBAL_LIST_KEY} ({}): kept out",
            shown_list(&users)
        ));
        deny
    }

    /// Whether the sender of `source` is written out by id on
    /// `<P>_ALLOWED_USERS` or `GATEWAY_ALLOWED_USERS` (a `*` names nobody):
    /// the people the operator typed in by hand, who own the gateway when
    /// `gateway.owners` says nothing about the platform.
    pub fn names_sender(&self, source: &SessionSource, caps: &Capabilities) -> bool {
        let Some(user) = source
            .user_id
            .as_deref()
            .map(str::trim)
            .filter(|u| !u.is_empty())
        else {
            return false;
        };
        let platform = source.platform.to_ascii_lowercase();
        let caseless = caps.sender_ids.caseless();
        let mut users = self.platform_list(&platform, "ALLOWED_USERS");
        users.extend(self.list(GLOBAL_LIST_KEY));
        users.iter().any(|e| {
            if caseless {
                e.eq_ignore_ascii_case(user)
            } else {
                *e == user
            }
        })
    }

    /// The non-empty, trimmed entries of a comma-separated variable.
    fn list(&self, key: &str) -> Vec<&str> {
        self.env
            .get(key)
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|e| !e.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `<P>_<suffix>`'s entries, and those of the ancestor's name for the
    /// same variable where it used another prefix.
    fn platform_list(&self, platform: &str, suffix: &str) -> Vec<&str> {
        let mut entries = self.list(&talaria_core::config::platform_var(platform, suffix));
        if let Some(prefix) = ancestor_prefix(platform) {
            entries.extend(self.list(&format!("{prefix}_{suffix}")));
        }
        entries
    }

    /// `<P>_<suffix>` (or the ancestor's name for it) is set true.
    fn platform_flag(&self, platform: &str, suffix: &str) -> bool {
        self.flag(&talaria_core::config::platform_var(platform, suffix))
            || ancestor_prefix(platform).is_some_and(|p| self.flag(&format!("{p}_{suffix}")))
    }

    fn flag(&self, key: &str) -> bool {
        self.env.get(key).is_some_and(|v| {
            let v = v.trim();
            ["true", "1", "yes"]
                .iter()
                .any(|t| v.eq_ignore_ascii_case(t))
        })
    }
}

/// The prefix the system this one descends from gave a platform's user
/// variables where it is not the platform's name: QQ Bot (`qqbot`) read
/// `QQ_ALLOWED_USERS` and `QQ_ALLOW_ALL_USERS`. Both names are honoured.
fn ancestor_prefix(platform: &str) -> Option<&'static str> {
    match platform {
        "qqbot" => Some("QQ"),
        _ => None,
    }
}

/// `<P>_<suffix>` as [`talaria_core::config::platform_var`] spells it,
/// written out only when displayed: deciding a message costs no string.
struct VarName<'a>(&'a str, &'static str);

impl fmt::Display for VarName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&talaria_core::config::platform_var(self.0, self.1))
    }
}

/// A list's entries for a sentence: a few of them, or that it is empty.
fn shown_list(entries: &[&str]) -> String {
    const SHOWN: usize = 5;
    match entries.len() {
        0 => "the list is empty".to_owned(),
        n if n <= SHOWN => format!("it holds {}", entries.join(", ")),
        n => format!(
            "it holds {}, and {} more",
            entries[..SHOWN].join(", "),
            n - SHOWN
        ),
    }
}

/// Chat types in which `<P>_GROUP_ALLOWED_CHATS` applies.
fn is_group_scoped(chat_type: ChatType) -> bool {
    matches!(
        chat_type,
        ChatType::Group | ChatType::Forum | ChatType::Channel
    )
}

#[cfg(test)]
mod tests;
