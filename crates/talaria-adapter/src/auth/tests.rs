//! The authorization rules as tables and properties.

use proptest::prelude::*;

use super::*;
use crate::SenderIds;
use crate::contract::{LengthUnit, MessageLimits};

/// What the adapters of the platforms in these tables declare.
fn caps(platform: &str) -> Capabilities {
    let base = Capabilities::chat(MessageLimits {
        max_len: 4096,
        unit: LengthUnit::Chars,
    });
    match platform {
        "email" => Capabilities {
            sender_ids: SenderIds::Email,
            ..base
        },
        "telegram" => Capabilities {
            group_chat_allowlist: true,
            ..base
        },
        "irc" => Capabilities {
            sender_ids: SenderIds::Nick,
            ..base
        },
        _ => base,
    }
}

fn source(platform: &str, chat_type: ChatType, chat_id: &str, user: Option<&str>) -> SessionSource {
    SessionSource {
        platform: platform.to_owned(),
        chat_id: chat_id.to_owned(),
        chat_name: None,
        chat_type,
        user_id: user.map(str::to_owned),
        user_name: None,
        thread_id: None,
        is_bot: false,
    }
}

fn dm(platform: &str, user: &str) -> SessionSource {
    SessionSource::dm(platform, user, user)
}

fn group(platform: &str, chat_id: &str, user: Option<&str>) -> SessionSource {
    source(platform, ChatType::Group, chat_id, user)
}

fn bot(mut s: SessionSource) -> SessionSource {
    s.is_bot = true;
    s
}

const ALLOW_GROUP: Decision = Decision::Allow(Reason::GroupChat);
const ALLOW_PLATFORM: Decision = Decision::Allow(Reason::PlatformAllowAll);
const ALLOW_PAIRED: Decision = Decision::Allow(Reason::Paired);
const ALLOW_GLOBAL: Decision = Decision::Allow(Reason::GlobalAllowAll);
const ALLOW_WILDCARD: Decision = Decision::Allow(Reason::Wildcard);
const ALLOW_LISTED: Decision = Decision::Allow(Reason::Allowlisted);
const DENY_OFFER: Decision = Decision::Deny {
    offer_pairing: true,
};
const DENY: Decision = Decision::Deny {
    offer_pairing: false,
};

struct Case {
    name: &'static str,
    env: &'static [(&'static str, &'static str)],
    source: SessionSource,
    paired: bool,
    want: Decision,
}

fn case(
    name: &'static str,
    env: &'static [(&'static str, &'static str)],
    source: SessionSource,
    want: Decision,
) -> Case {
    Case {
        name,
        env,
        source,
        paired: false,
        want,
    }
}

#[test]
fn decision_table() {
    let chats: &[(&str, &str)] = &[("TELEGRAM_GROUP_ALLOWED_CHATS", " -100 , -200 ")];
    let cases = vec![
        // 1. Telegram group chat list.
        case(
            "listed group",
            chats,
            group("telegram", "-100", Some("7")),
            ALLOW_GROUP,
        ),
        case(
            "listed forum",
            chats,
            source("telegram", ChatType::Forum, "-200", Some("7")),
            ALLOW_GROUP,
        ),
        case(
            "anonymous channel post in a listed channel",
            chats,
            source("telegram", ChatType::Channel, "-100", None),
            ALLOW_GROUP,
        ),
        case(
            "wildcard chat list",
            &[("TELEGRAM_GROUP_ALLOWED_CHATS", "*")],
            group("telegram", "-999", Some("7")),
            ALLOW_GROUP,
        ),
        case(
            "unlisted group, no offer",
            chats,
            group("telegram", "-300", Some("7")),
            DENY,
        ),
        case(
            "chat list does not apply to DMs",
            chats,
            source("telegram", ChatType::Dm, "-100", Some("7")),
            DENY_OFFER,
        ),
        case(
            "chat list does not apply to threads",
            chats,
            source("telegram", ChatType::Thread, "-100", Some("7")),
            DENY,
        ),
        case(
            "chat list is telegram's only",
            chats,
            group("discord", "-100", Some("7")),
            DENY,
        ),
        case(
            "chat list switches global allow-all off in groups",
            &[
                ("TELEGRAM_GROUP_ALLOWED_CHATS", "-100"),
                ("GATEWAY_ALLOW_ALL_USERS", "true"),
            ],
            group("telegram", "-300", Some("7")),
            DENY,
        ),
        case(
            "anonymous admin shown as a bot in a listed group",
            chats,
            bot(group("telegram", "-100", Some("1087968824"))),
            ALLOW_GROUP,
        ),
        // 2. No user id.
        case(
            "anonymous post in an unlisted channel",
            chats,
            source("telegram", ChatType::Channel, "-300", None),
            DENY,
        ),
        case(
            "no user id beats allow-all",
            &[
                ("TELEGRAM_ALLOW_ALL_USERS", "true"),
                ("GATEWAY_ALLOW_ALL_USERS", "true"),
            ],
            source("telegram", ChatType::Dm, "5", None),
            DENY,
        ),
        case(
            "blank user id is no user id",
            &[("TELEGRAM_ALLOW_ALL_USERS", "true")],
            source("telegram", ChatType::Dm, "5", Some(" ")),
            DENY,
        ),
        // 3. Per-platform allow-all.
        case(
            "platform allow-all",
            &[("TELEGRAM_ALLOW_ALL_USERS", "true")],
            dm("telegram", "7"),
            ALLOW_PLATFORM,
        ),
        case(
            "platform allow-all spelled YES",
            &[("TELEGRAM_ALLOW_ALL_USERS", " YES ")],
            group("telegram", "-1", Some("7")),
            ALLOW_PLATFORM,
        ),
        case(
            "platform allow-all spelled 1, beats a list",
            &[
                ("DISCORD_ALLOW_ALL_USERS", "1"),
                ("DISCORD_ALLOWED_USERS", "42"),
            ],
            dm("discord", "7"),
            ALLOW_PLATFORM,
        ),
        case(
            "allow-all set to no",
            &[("TELEGRAM_ALLOW_ALL_USERS", "no")],
            dm("telegram", "7"),
            DENY_OFFER,
        ),
        case(
            "allow-all set to false",
            &[("TELEGRAM_ALLOW_ALL_USERS", "false")],
            dm("telegram", "7"),
            DENY_OFFER,
        ),
        case(
            "platform allow-all does not leak to another platform",
            &[("TELEGRAM_ALLOW_ALL_USERS", "true")],
            dm("discord", "7"),
            DENY_OFFER,
        ),
        case(
            "whatsapp allow-all does not leak to whatsapp_cloud",
            &[("WHATSAPP_ALLOW_ALL_USERS", "true")],
            dm("whatsapp_cloud", "7"),
            DENY_OFFER,
        ),
        case(
            "underscored platform names map to their variables",
            &[("WHATSAPP_CLOUD_ALLOWED_USERS", "7")],
            dm("whatsapp_cloud", "7"),
            ALLOW_LISTED,
        ),
        // 4. Paired.
        Case {
            paired: true,
            ..case(
                "paired stranger",
                &[("TELEGRAM_ALLOWED_USERS", "42")],
                dm("telegram", "7"),
                ALLOW_PAIRED,
            )
        },
        Case {
            paired: true,
            ..case("paired, no lists", &[], dm("signal", "7"), ALLOW_PAIRED)
        },
        // 5. No list configured: the global flag decides.
        case(
            "no lists: stranger DM is offered a code",
            &[],
            dm("telegram", "7"),
            DENY_OFFER,
        ),
        case(
            "no lists: stranger in a group gets nothing",
            &[],
            group("telegram", "-1", Some("7")),
            DENY,
        ),
        case(
            "no lists: global allow-all",
            &[("GATEWAY_ALLOW_ALL_USERS", "true")],
            dm("telegram", "7"),
            ALLOW_GLOBAL,
        ),
        case(
            "another platform's list does not switch global allow-all off",
            &[
                ("DISCORD_ALLOWED_USERS", "42"),
                ("GATEWAY_ALLOW_ALL_USERS", "true"),
            ],
            dm("telegram", "7"),
            ALLOW_GLOBAL,
        ),
        case(
            "a list of blank entries is no list",
            &[
                ("TELEGRAM_ALLOWED_USERS", " , ,"),
                ("GATEWAY_ALLOW_ALL_USERS", "yes"),
            ],
            dm("telegram", "7"),
            ALLOW_GLOBAL,
        ),
        case(
            "platform list switches global allow-all off",
            &[
                ("TELEGRAM_ALLOWED_USERS", "42"),
                ("GATEWAY_ALLOW_ALL_USERS", "true"),
            ],
            dm("telegram", "7"),
            DENY,
        ),
        case(
            "global list switches global allow-all off",
            &[
                ("GATEWAY_ALLOWED_USERS", "42"),
                ("GATEWAY_ALLOW_ALL_USERS", "true"),
            ],
            dm("discord", "7"),
            DENY,
        ),
        // 6. Configured lists.
        case(
            "listed in the platform list",
            &[
                ("TELEGRAM_ALLOWED_USERS", "42"),
                ("GATEWAY_ALLOW_ALL_USERS", "true"),
            ],
            dm("telegram", "42"),
            ALLOW_LISTED,
        ),
        case(
            "entries are trimmed",
            &[("TELEGRAM_ALLOWED_USERS", " 1 , 42 ,")],
            group("telegram", "-1", Some("42")),
            ALLOW_LISTED,
        ),
        case(
            "listed in the global list, any platform",
            &[("GATEWAY_ALLOWED_USERS", "42")],
            dm("matrix", "42"),
            ALLOW_LISTED,
        ),
        case(
            "platform and global lists are united",
            &[
                ("TELEGRAM_ALLOWED_USERS", "1"),
                ("GATEWAY_ALLOWED_USERS", "42"),
            ],
            dm("telegram", "42"),
            ALLOW_LISTED,
        ),
        case(
            "another platform's list does not admit",
            &[("DISCORD_ALLOWED_USERS", "42")],
            dm("telegram", "42"),
            DENY_OFFER,
        ),
        case(
            "wildcard in the platform list",
            &[("SLACK_ALLOWED_USERS", "U1, *")],
            group("slack", "C1", Some("U9")),
            ALLOW_WILDCARD,
        ),
        case(
            "wildcard in the global list",
            &[("GATEWAY_ALLOWED_USERS", "*")],
            dm("discord", "9"),
            ALLOW_WILDCARD,
        ),
        case(
            "a substring is not an id",
            &[("TELEGRAM_ALLOWED_USERS", "42")],
            dm("telegram", "421"),
            DENY,
        ),
        case(
            "a local part is not an address",
            &[("TELEGRAM_ALLOWED_USERS", "alice")],
            dm("telegram", "alice@evil.example"),
            DENY,
        ),
        case(
            "a local part is not an address, by e-mail either",
            &[("EMAIL_ALLOWED_USERS", "alice")],
            dm("email", "alice@evil.example"),
            DENY,
        ),
        case(
            "e-mail addresses compare case-insensitively",
            &[("EMAIL_ALLOWED_USERS", "Alice@Example.COM")],
            dm("email", "alice@example.com"),
            ALLOW_LISTED,
        ),
        case(
            "e-mail via the global list, case-insensitively",
            &[("GATEWAY_ALLOWED_USERS", "ALICE@example.com")],
            dm("email", "alice@EXAMPLE.com"),
            ALLOW_LISTED,
        ),
        case(
            "other ids compare case-sensitively",
            &[("MATRIX_ALLOWED_USERS", "@Alice:example.org")],
            dm("matrix", "@alice:example.org"),
            DENY,
        ),
        case(
            "nicks compare case-insensitively",
            &[("IRC_ALLOWED_USERS", "Alice")],
            dm("irc", "alice"),
            ALLOW_LISTED,
        ),
        case(
            "nick strangers are never offered a code",
            &[],
            dm("irc", "mallory"),
            DENY,
        ),
        case(
            "e-mail strangers are never offered a code",
            &[],
            dm("email", "bob@example.com"),
            DENY,
        ),
        case(
            "platform name case does not matter",
            &[("TELEGRAM_ALLOWED_USERS", "42")],
            dm("Telegram", "42"),
            ALLOW_LISTED,
        ),
        // Bots.
        case(
            "bot with platform allow-all",
            &[("TELEGRAM_ALLOW_ALL_USERS", "true")],
            bot(dm("telegram", "99")),
            DENY,
        ),
        case(
            "bot with global allow-all",
            &[("GATEWAY_ALLOW_ALL_USERS", "true")],
            bot(dm("telegram", "99")),
            DENY,
        ),
        case(
            "bot under a wildcard",
            &[("TELEGRAM_ALLOWED_USERS", "*")],
            bot(dm("telegram", "99")),
            DENY,
        ),
        Case {
            paired: true,
            ..case("paired bot", &[], bot(dm("telegram", "99")), DENY)
        },
        case(
            "bot listed by id",
            &[("TELEGRAM_ALLOWED_USERS", "*,99")],
            bot(group("telegram", "-1", Some("99"))),
            ALLOW_LISTED,
        ),
        case(
            "bot listed globally",
            &[("GATEWAY_ALLOWED_USERS", "99")],
            bot(dm("discord", "99")),
            ALLOW_LISTED,
        ),
    ];
    for c in cases {
        let policy = AuthPolicy::from_env(&Env::from_pairs(c.env.iter().copied()));
        assert_eq!(
            policy.decide(&c.source, &caps(&c.source.platform), c.paired),
            c.want,
            "{}",
            c.name
        );
    }
}

#[test]
fn debug_does_not_print_the_environment() {
    let p = AuthPolicy::from_env(&Env::from_pairs([
        ("OPENAI_API_KEY", "sk-very-secret-value"),
        ("GATEWAY_ALLOWED_USERS", "42"),
    ]));
    let shown = format!("{p:?}");
    assert!(!shown.contains("sk-very-secret-value"), "{shown}");
    assert!(shown.contains("42"), "{shown}");
}

// The property test's model of the rules, written from the rule list
// rather than from the code above.

const PLATFORMS: &[&str] = &["telegram", "discord", "email", "whatsapp_cloud"];
const PREFIXES: &[&str] = &["TELEGRAM", "DISCORD", "EMAIL", "WHATSAPP_CLOUD"];
const FLAG_VALUES: &[&str] = &["true", "1", "YES", "Yes", "no", "0", "false", ""];
const USER_ENTRIES: &[&str] = &["a", "b", "A", "*", "", " b ", "a@x"];
const CHAT_ENTRIES: &[&str] = &["c1", "c2", "*", "", " c1 "];
const USERS: &[&str] = &["a", "b", "A", "z", "a@x", "A@X"];
const CHATS: &[&str] = &["c1", "c2", "c3"];
const CHAT_TYPES: &[ChatType] = &[
    ChatType::Dm,
    ChatType::Group,
    ChatType::Channel,
    ChatType::Thread,
    ChatType::Forum,
];

#[derive(Debug, Clone)]
struct Config {
    platform_flags: Vec<Option<&'static str>>,
    platform_lists: Vec<Option<Vec<&'static str>>>,
    global_flag: Option<&'static str>,
    global_list: Option<Vec<&'static str>>,
    group_chats: Option<Vec<&'static str>>,
}

impl Config {
    fn env(&self) -> Env {
        let mut pairs: Vec<(String, String)> = Vec::new();
        for (i, prefix) in PREFIXES.iter().enumerate() {
            if let Some(v) = self.platform_flags[i] {
                pairs.push((format!("{prefix}_ALLOW_ALL_USERS"), v.to_owned()));
            }
            if let Some(l) = &self.platform_lists[i] {
                pairs.push((format!("{prefix}_ALLOWED_USERS"), l.join(",")));
            }
        }
        if let Some(v) = self.global_flag {
            pairs.push(("GATEWAY_ALLOW_ALL_USERS".into(), v.to_owned()));
        }
        if let Some(l) = &self.global_list {
            pairs.push(("GATEWAY_ALLOWED_USERS".into(), l.join(",")));
        }
        if let Some(l) = &self.group_chats {
            pairs.push(("TELEGRAM_GROUP_ALLOWED_CHATS".into(), l.join(",")));
        }
        Env::from_pairs(pairs)
    }
}

fn pick<T: Clone + std::fmt::Debug + 'static>(items: &'static [T]) -> impl Strategy<Value = T> {
    proptest::sample::select(items)
}

fn some_list(items: &'static [&'static str]) -> impl Strategy<Value = Option<Vec<&'static str>>> {
    // Mostly unset, so that the "no list configured" branches are
    // reached often enough.
    proptest::option::weighted(0.4, proptest::collection::vec(pick(items), 0..4))
}

fn config() -> impl Strategy<Value = Config> {
    (
        proptest::collection::vec(proptest::option::of(pick(FLAG_VALUES)), PLATFORMS.len()),
        proptest::collection::vec(some_list(USER_ENTRIES), PLATFORMS.len()),
        proptest::option::of(pick(FLAG_VALUES)),
        some_list(USER_ENTRIES),
        some_list(CHAT_ENTRIES),
    )
        .prop_map(
            |(platform_flags, platform_lists, global_flag, global_list, group_chats)| Config {
                platform_flags,
                platform_lists,
                global_flag,
                global_list,
                group_chats,
            },
        )
}

fn message() -> impl Strategy<Value = (usize, SessionSource)> {
    (
        0..PLATFORMS.len(),
        pick(CHAT_TYPES),
        pick(CHATS),
        proptest::option::of(pick(USERS)),
        any::<bool>(),
    )
        .prop_map(|(p, chat_type, chat, user, is_bot)| {
            let mut s = source(PLATFORMS[p], chat_type, chat, user);
            s.is_bot = is_bot;
            (p, s)
        })
}

fn is_on(flag: Option<&str>) -> bool {
    matches!(
        flag.map(|f| f.to_lowercase()).as_deref(),
        Some("true" | "1" | "yes")
    )
}

fn entries(list: &Option<Vec<&'static str>>) -> Vec<String> {
    list.iter()
        .flatten()
        .map(|e| e.trim().to_owned())
        .filter(|e| !e.is_empty())
        .collect()
}

/// Whether the rules admit the message, and whether a denial would come
/// with a pairing offer.
fn oracle(c: &Config, p: usize, s: &SessionSource) -> (bool, bool) {
    let telegram_group = PLATFORMS[p] == "telegram"
        && matches!(
            s.chat_type,
            ChatType::Group | ChatType::Forum | ChatType::Channel
        );
    let chats = if telegram_group {
        entries(&c.group_chats)
    } else {
        Vec::new()
    };
    let chat_rule = chats.iter().any(|e| e == "*" || *e == s.chat_id);

    let mut users = entries(&c.platform_lists[p]);
    users.extend(entries(&c.global_list));
    let same = |e: &str, u: &str| {
        if PLATFORMS[p] == "email" {
            e.to_lowercase() == u.to_lowercase()
        } else {
            e == u
        }
    };

    let allowed = match &s.user_id {
        _ if chat_rule => true,
        None => false,
        Some(u) if s.is_bot => users.iter().any(|e| same(e, u)),
        Some(u) => {
            is_on(c.platform_flags[p])
                || (is_on(c.global_flag) && users.is_empty() && chats.is_empty())
                || users.iter().any(|e| e == "*" || same(e, u))
        }
    };
    let offer = !allowed
        && s.chat_type == ChatType::Dm
        && s.user_id.is_some()
        && !s.is_bot
        && PLATFORMS[p] != "email"
        && users.is_empty();
    (allowed, offer)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn only_the_listed_rules_admit_anyone(c in config(), (p, s) in message()) {
        let decision = AuthPolicy::from_env(&c.env()).decide(&s, &caps(&s.platform), false);
        let (allowed, offer) = oracle(&c, p, &s);
        prop_assert_eq!(decision.is_allowed(), allowed, "{:?}", decision);
        if let Decision::Deny { offer_pairing } = decision {
            prop_assert_eq!(offer_pairing, offer);
        }
    }

    #[test]
    fn pairing_admits_humans_with_an_id_only(c in config(), (_p, s) in message()) {
        let policy = AuthPolicy::from_env(&c.env());
        let paired = policy.decide(&s, &caps(&s.platform), true);
        let unpaired = policy.decide(&s, &caps(&s.platform), false);
        if unpaired.is_allowed() {
            prop_assert!(paired.is_allowed());
        } else if s.user_id.is_some() && !s.is_bot {
            prop_assert_eq!(paired, ALLOW_PAIRED);
        } else {
            prop_assert_eq!(paired, unpaired);
        }
    }

    /// `doctor auth` tells what the gateway does: the explained decision
    /// is the decision, and its last step says which way it went.
    #[test]
    fn the_explanation_reaches_the_decision(c in config(), (_p, s) in message(), paired in any::<bool>()) {
        let policy = AuthPolicy::from_env(&c.env());
        let caps = caps(&s.platform);
        let (explained, steps) = policy.explain(&s, &caps, paired);
        prop_assert_eq!(explained, policy.decide(&s, &caps, paired));
        let last = steps.last().cloned().unwrap_or_default();
        let verdict = if explained.is_allowed() { "let in" } else { "kept out" };
        prop_assert!(last.ends_with(verdict), "{:?} after {:?}", explained, steps);
    }
}

#[test]
fn qq_bot_reads_the_ancestors_qq_variables_too() {
    let policy = |pairs: &[(&str, &str)]| AuthPolicy::from_env(&Env::from_pairs(pairs.to_vec()));
    let caps = caps("qqbot");
    let listed = policy(&[("QQ_ALLOWED_USERS", "OPENID1")]);
    assert_eq!(
        listed.decide(&dm("qqbot", "OPENID1"), &caps, false),
        ALLOW_LISTED
    );
    assert!(listed.names_sender(&dm("qqbot", "OPENID1"), &caps));
    assert!(
        !listed
            .decide(&dm("qqbot", "OPENID2"), &caps, false)
            .is_allowed()
    );
    let own = policy(&[("QQBOT_ALLOWED_USERS", "OPENID2")]);
    assert_eq!(
        own.decide(&dm("qqbot", "OPENID2"), &caps, false),
        ALLOW_LISTED
    );
    let all = policy(&[("QQ_ALLOW_ALL_USERS", "true")]);
    assert_eq!(
        all.decide(&dm("qqbot", "ANY"), &caps, false),
        ALLOW_PLATFORM
    );
    // Only QQ Bot: another platform's `QQ_` is not its variable.
    assert!(
        !listed
            .decide(&dm("discord", "OPENID1"), &caps, false)
            .is_allowed()
    );
}
