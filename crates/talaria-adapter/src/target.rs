//! Delivery targets: where a message that is not a reply goes (a
//! `send_message` call, `talaria send`, a webhook's answer, later cron).
//!
//! The grammar, one of:
//!
//! - `origin`: back to the chat the request came from;
//! - `local`: a file under `$TALARIA_HOME/cron/output/`, no platform;
//! - `<platform>`: that platform's home channel;
//! - `<platform>:<chat_id>`, `<platform>:<chat_id>:<thread_id>`.
//!
//! The platform is matched case-insensitively and printed lower-case; ids
//! keep their case. An id that holds colons (a Matrix room id) is written
//! in brackets, as IPv6 addresses are in URLs:
//! `matrix:[!room:example.org]:[$event:example.org]`; ids never contain
//! brackets. For every target `t`, `parse(print(t)) == t`, and for
//! every canonical string `s` (lower-case platform), `print(parse(s)) == s`.
//!
//! Home channels come from `gateway.home_channels` in the config and from
//! `<PLATFORM>_HOME_CHANNEL` / `<PLATFORM>_HOME_CHANNEL_THREAD_ID` in the
//! environment or `.env` (which win, since `/sethome` writes them).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::RwLock;

use talaria_core::Env;
use talaria_core::config::platform_var;

/// The longest target string accepted, in bytes.
const MAX_LEN: usize = 512;

/// Where a message goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// The chat the request came from.
    Origin,
    /// A file in the home, for output nobody is waiting for in a chat.
    Local,
    /// The platform's home channel.
    /// The platform's home channel (`<platform>` alone).
    Home {
        /// The platform whose home channel is meant.
        platform: String,
    },
    /// A chat (and a thread or topic in it).
    Chat {
        /// The platform, as in the configuration.
        platform: String,
        /// The platform's chat id.
        chat_id: String,
        /// A thread or topic of that chat, when the platform has them.
        thread_id: Option<String>,
    },
}

/// Why a target string is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// Nothing was given.
    #[error("the delivery target is empty")]
    Empty,
    /// Longer than any target can be; refused before it is parsed.
    #[error("the delivery target is too long (at most {MAX_LEN} bytes)")]
    TooLong,
    #[error(
        "`{0}` is not a delivery target: expected origin, local, <platform>, <platform>:<chat_id> or <platform>:<chat_id>:<thread_id>"
    )]
    /// Text matching none of the forms; it is quoted back in the error.
    Malformed(String),
}

impl Target {
    /// The platform this target names, if any.
    pub fn platform(&self) -> Option<&str> {
        match self {
            Target::Home { platform } | Target::Chat { platform, .. } => Some(platform),
            Target::Origin | Target::Local => None,
        }
    }
}

impl FromStr for Target {
    type Err = TargetError;

    fn from_str(s: &str) -> Result<Target, TargetError> {
        if s.is_empty() {
            return Err(TargetError::Empty);
        }
        if s.len() > MAX_LEN {
            return Err(TargetError::TooLong);
        }
        let malformed = || TargetError::Malformed(s.chars().take(80).collect());
        let (head, rest) = match s.split_once(':') {
            Some((head, rest)) => (head, Some(rest)),
            None => (s, None),
        };
        let platform = head.to_ascii_lowercase();
        if !is_platform_name(&platform) {
            return Err(malformed());
        }
        let (chat, thread) = match rest {
            None => (None, None),
            Some(rest) => {
                let (chat, after) = split_id(rest).ok_or_else(malformed)?;
                let thread = match after {
                    None => None,
                    Some(after) => match split_id(after).ok_or_else(malformed)? {
                        (thread, None) => Some(thread),
                        (_, Some(_)) => return Err(malformed()),
                    },
                };
                (Some(chat), thread)
            }
        };
        match (platform.as_str(), chat, thread) {
            ("origin", None, None) => Ok(Target::Origin),
            ("local", None, None) => Ok(Target::Local),
            ("origin" | "local", _, _) => Err(malformed()),
            (_, None, None) => Ok(Target::Home { platform }),
            (_, Some(chat), thread) => Ok(Target::Chat {
                platform,
                chat_id: chat.to_owned(),
                thread_id: thread.map(str::to_owned),
            }),
            (_, None, Some(_)) => Err(malformed()),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Origin => f.write_str("origin"),
            Target::Local => f.write_str("local"),
            Target::Home { platform } => f.write_str(platform),
            Target::Chat {
                platform,
                chat_id,
                thread_id: None,
            } => write!(f, "{platform}:{}", Shown(chat_id)),
            Target::Chat {
                platform,
                chat_id,
                thread_id: Some(thread),
            } => write!(f, "{platform}:{}:{}", Shown(chat_id), Shown(thread)),
        }
    }
}

/// `[a-z][a-z0-9_-]*`, the shape of every platform name.
fn is_platform_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// A chat id that is a whole value rather than part of a target string
/// (`<PLATFORM>_HOME_CHANNEL`, which `/sethome` writes): colons are part of
/// the id there, as in Matrix room ids (`!opaque:example.org`).
fn is_whole_id(s: &str) -> bool {
    !s.is_empty() && !s.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// A chat or thread id as written bare: not empty, no colon, no bracket,
/// no whitespace or control characters (which no platform uses and which
/// would garble logs).
fn is_id(s: &str) -> bool {
    !s.contains(':') && is_bracketed_id(s)
}

/// An id written in brackets (`[!room:example.org]`): colons allowed.
fn is_bracketed_id(s: &str) -> bool {
    !s.is_empty()
        && !s
            .chars()
            .any(|c| matches!(c, '[' | ']') || c.is_whitespace() || c.is_control())
}

/// Splits the id at the start of `text` (bare, or in brackets when it
/// holds colons) from what follows its separating colon, if anything does.
fn split_id(text: &str) -> Option<(&str, Option<&str>)> {
    if let Some(inner) = text.strip_prefix('[') {
        let (id, after) = inner.split_once(']')?;
        let rest = match after {
            "" => None,
            after => Some(after.strip_prefix(':')?),
        };
        return is_bracketed_id(id).then_some((id, rest));
    }
    let (id, rest) = match text.split_once(':') {
        Some((id, rest)) => (id, Some(rest)),
        None => (text, None),
    };
    is_id(id).then_some((id, rest))
}

/// An id as a target string writes it: in brackets when it holds a colon.
struct Shown<'a>(&'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.contains(':') {
            write!(f, "[{}]", self.0)
        } else {
            f.write_str(self.0)
        }
    }
}

/// A platform's home channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeChannel {
    /// The chat answers go to.
    pub chat_id: String,
    /// A thread or topic in that chat, if the home is one.
    pub thread_id: Option<String>,
}

/// Every platform's home channel, updated live by `/sethome`.
#[derive(Debug, Default)]
pub struct HomeChannels {
    by_platform: RwLock<BTreeMap<String, HomeChannel>>,
}

impl HomeChannels {
    /// From `gateway.home_channels` (values `<chat_id>[:<thread_id>]`),
    /// overridden by `<PLATFORM>_HOME_CHANNEL[_THREAD_ID]` for each platform
    /// in `platforms`.
    pub fn load(config: &BTreeMap<String, String>, env: &Env, platforms: &[&str]) -> HomeChannels {
        let mut map = BTreeMap::new();
        for (platform, value) in config {
            let platform = platform.to_ascii_lowercase();
            // The same id syntax as targets: brackets around an id with
            // colons.
            let parsed = split_id(value.trim()).and_then(|(chat, rest)| match rest {
                None => Some((chat, None)),
                Some(rest) => match split_id(rest)? {
                    (thread, None) => Some((chat, Some(thread))),
                    (_, Some(_)) => None,
                },
            });
            let Some((chat, thread)) = parsed else {
                tracing::warn!(platform = %platform, "gateway.home_channels has an unusable entry; ignored");
                continue;
            };
            map.insert(
                platform,
                HomeChannel {
                    chat_id: chat.to_owned(),
                    thread_id: thread.map(str::to_owned),
                },
            );
        }
        for platform in platforms {
            let Some(chat) = env
                .get(&platform_var(platform, "HOME_CHANNEL"))
                .map(|c| c.trim().to_owned())
                .filter(|c| is_whole_id(c))
            else {
                continue;
            };
            let thread = env
                .get(&platform_var(platform, "HOME_CHANNEL_THREAD_ID"))
                .map(|t| t.trim().to_owned())
                .filter(|t| is_id(t));
            map.insert(
                platform.to_ascii_lowercase(),
                HomeChannel {
                    chat_id: chat,
                    thread_id: thread,
                },
            );
        }
        HomeChannels {
            by_platform: RwLock::new(map),
        }
    }

    /// The home channel set for `platform`, if any (from the configuration
    /// or set at run time with `/sethome`).
    pub fn get(&self, platform: &str) -> Option<HomeChannel> {
        self.by_platform
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(platform)
            .cloned()
    }

    /// Sets (or replaces) a platform's home channel for this process.
    pub fn set(&self, platform: &str, home: HomeChannel) {
        self.by_platform
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(platform.to_owned(), home);
    }

    /// Every home channel, by platform.
    pub fn all(&self) -> BTreeMap<String, HomeChannel> {
        self.by_platform
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(s: &str) -> Result<Target, TargetError> {
        s.parse()
    }

    #[test]
    fn every_form_parses() {
        assert_eq!(parse("origin"), Ok(Target::Origin));
        assert_eq!(parse("local"), Ok(Target::Local));
        assert_eq!(
            parse("Telegram"),
            Ok(Target::Home {
                platform: "telegram".into()
            })
        );
        assert_eq!(
            parse("telegram:-100123"),
            Ok(Target::Chat {
                platform: "telegram".into(),
                chat_id: "-100123".into(),
                thread_id: None
            })
        );
        assert_eq!(
            parse("slack:C0ABC:1712345678.000100"),
            Ok(Target::Chat {
                platform: "slack".into(),
                chat_id: "C0ABC".into(),
                thread_id: Some("1712345678.000100".into())
            })
        );
    }

    #[test]
    fn ids_with_colons_are_written_in_brackets() {
        let room = Target::Chat {
            platform: "matrix".into(),
            chat_id: "!room:example.org".into(),
            thread_id: Some("$root:example.org".into()),
        };
        assert_eq!(
            room.to_string(),
            "matrix:[!room:example.org]:[$root:example.org]"
        );
        assert_eq!(
            parse("matrix:[!room:example.org]:[$root:example.org]"),
            Ok(room)
        );
        assert_eq!(
            parse("Matrix:[!room:example.org]"),
            Ok(Target::Chat {
                platform: "matrix".into(),
                chat_id: "!room:example.org".into(),
                thread_id: None,
            })
        );
        // Brackets around a plain id are accepted and printed without.
        assert_eq!(
            parse("slack:[C0ABC]").map(|t| t.to_string()),
            Ok("slack:C0ABC".to_owned())
        );
        for bad in [
            "matrix:[!room:example.org",
            "matrix:[]",
            "matrix:[a]b",
            "matrix:[a]:",
            "matrix:[a]:[b]:[c]",
            "matrix:[a[b]]",
            "matrix:!room:example.org:extra",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn malformed_targets_are_refused_with_the_grammar() {
        for bad in [
            "",
            ":",
            "telegram:",
            "telegram::5",
            "telegram:1:",
            "telegram:1:2:3",
            "origin:5",
            "local:x",
            "tele gram",
            "telegram:a b",
            "1telegram",
            "tg\n:1",
        ] {
            let e = parse(bad).unwrap_err();
            if !bad.is_empty() {
                assert!(e.to_string().contains("expected origin"), "{bad:?}: {e}");
            }
        }
        assert_eq!(parse(&"x".repeat(600)), Err(TargetError::TooLong));
    }

    #[test]
    fn home_channels_come_from_config_and_the_environment_wins() {
        let config: BTreeMap<String, String> = [
            ("telegram".to_owned(), "111:7".to_owned()),
            ("discord".to_owned(), "222".to_owned()),
            ("slack".to_owned(), "bad id".to_owned()),
        ]
        .into();
        let env = Env::from_pairs([
            ("TELEGRAM_HOME_CHANNEL", "999"),
            ("TELEGRAM_HOME_CHANNEL_THREAD_ID", "42"),
        ]);
        let homes = HomeChannels::load(&config, &env, &["telegram", "discord", "slack"]);
        assert_eq!(
            homes.get("telegram"),
            Some(HomeChannel {
                chat_id: "999".into(),
                thread_id: Some("42".into())
            })
        );
        assert_eq!(
            homes.get("discord"),
            Some(HomeChannel {
                chat_id: "222".into(),
                thread_id: None
            })
        );
        assert_eq!(homes.get("slack"), None);
        let env = Env::from_pairs([("MATRIX_HOME_CHANNEL", "!room:example.org")]);
        let matrix = HomeChannels::load(&BTreeMap::new(), &env, &["matrix"]);
        assert_eq!(
            matrix.get("matrix").map(|h| h.chat_id),
            Some("!room:example.org".to_owned())
        );
        homes.set(
            "slack",
            HomeChannel {
                chat_id: "C1".into(),
                thread_id: None,
            },
        );
        assert_eq!(homes.all().len(), 3);
    }

    fn id() -> impl Strategy<Value = String> {
        "[A-Za-z0-9_.@!$+=/:-]{1,20}"
    }

    fn target() -> impl Strategy<Value = Target> {
        let platform = "[a-z][a-z0-9_-]{0,12}"
            .prop_filter("reserved words", |p| p != "origin" && p != "local");
        prop_oneof![
            Just(Target::Origin),
            Just(Target::Local),
            platform
                .clone()
                .prop_map(|platform| Target::Home { platform }),
            (platform, id(), proptest::option::of(id())).prop_map(
                |(platform, chat_id, thread_id)| Target::Chat {
                    platform,
                    chat_id,
                    thread_id
                }
            ),
        ]
    }

    proptest! {
        #[test]
        fn printing_and_parsing_round_trip(t in target()) {
            let printed = t.to_string();
            prop_assert_eq!(parse(&printed), Ok(t));
            // A canonical string survives the other way round too.
            prop_assert_eq!(parse(&printed).map(|t| t.to_string()), Ok(printed));
        }

        #[test]
        fn any_string_either_parses_to_something_printable_or_is_refused(s in "\\PC{0,40}") {
            if let Ok(t) = parse(&s) {
                // Whatever parses prints to the same target again.
                prop_assert_eq!(parse(&t.to_string()), Ok(t));
            }
        }
    }
}
