//! Session keys: which conversation a message belongs to.
//!
//! A key is computed once per event, here and nowhere else, and carried
//! with the event from then on; the runner's busy guard, the session
//! router and the ledger all use the same string.

use std::fmt;

use talaria_core::ids::{IdError, validate_logical_key};

use crate::event::{ChatType, SessionSource};

/// The namespace every key starts with (the ancestor's default profile).
const NAMESPACE: &str = "agent:main";

/// How shared chats are divided into conversations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyPolicy {
    /// Each member of a group or channel gets a conversation of their own.
    pub group_sessions_per_user: bool,
    /// Inside threads and topics too (otherwise a thread is shared).
    pub thread_sessions_per_user: bool,
}

impl Default for KeyPolicy {
    fn default() -> KeyPolicy {
        KeyPolicy {
            group_sessions_per_user: true,
            thread_sessions_per_user: false,
        }
    }
}

impl KeyPolicy {
    /// The policy the gateway section of the configuration asks for.
    pub fn from_config(config: &talaria_core::config::GatewayConfig) -> KeyPolicy {
        KeyPolicy {
            group_sessions_per_user: config.group_sessions_per_user,
            thread_sessions_per_user: config.thread_sessions_per_user,
        }
    }
}

/// A conversation's routing key, e.g. `agent:main:telegram:dm:42`.
///
/// Always valid as a logical key: no `..` segment, no leading `/`, no
/// control characters (it is never used as a path).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionKey(String);

impl SessionKey {
    /// The key for a message from `source`.
    ///
    /// DMs: `agent:main:<platform>:dm:<chat_id>[:<thread_id>]`. Other chats:
    /// `agent:main:<platform>:<chat_type>:<chat_id>[:<thread_id>][:<user_id>]`,
    /// with the user appended when the policy isolates members (outside
    /// threads: `group_sessions_per_user`; inside: `thread_sessions_per_user`).
    ///
    /// # Errors
    /// When a platform id would make the key unsafe (a `..` segment, control
    /// characters): such a message is refused rather than routed.
    pub fn for_source(source: &SessionSource, policy: KeyPolicy) -> Result<SessionKey, IdError> {
        let mut key = format!("{NAMESPACE}:{}:{}", source.platform, source.chat_type);
        let mut push = |part: &str| {
            key.push(':');
            key.push_str(part);
        };
        push(&source.chat_id);
        let thread = source.thread_id.as_deref().filter(|t| !t.is_empty());
        if let Some(thread) = thread {
            push(thread);
        }
        if source.chat_type != ChatType::Dm {
            let isolate = if thread.is_some() {
                policy.thread_sessions_per_user
            } else {
                policy.group_sessions_per_user
            };
            if isolate && let Some(user) = source.user_id.as_deref().filter(|u| !u.is_empty()) {
                push(user);
            }
        }
        validate_logical_key(&key)?;
        Ok(SessionKey(key))
    }

    /// Wraps a key read back from storage, validating it again.
    ///
    /// # Errors
    /// When the text is not a safe logical key.
    pub fn parse(text: &str) -> Result<SessionKey, IdError> {
        validate_logical_key(text)?;
        Ok(SessionKey(text.to_owned()))
    }

    /// The key as text, as routes and leases store it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The platform part of the key.
    pub fn platform(&self) -> &str {
        self.0.split(':').nth(2).unwrap_or("")
    }
}

impl fmt::Display for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(chat_type: ChatType, chat: &str, thread: Option<&str>, user: &str) -> SessionSource {
        SessionSource {
            platform: "telegram".into(),
            chat_id: chat.into(),
            chat_name: None,
            chat_type,
            user_id: Some(user.into()),
            user_name: None,
            thread_id: thread.map(Into::into),
            is_bot: false,
        }
    }

    fn key(s: &SessionSource, policy: KeyPolicy) -> String {
        SessionKey::for_source(s, policy)
            .unwrap()
            .as_str()
            .to_owned()
    }

    #[test]
    fn keys_follow_the_documented_shapes() {
        let d = KeyPolicy::default();
        assert_eq!(
            key(&source(ChatType::Dm, "42", None, "42"), d),
            "agent:main:telegram:dm:42"
        );
        assert_eq!(
            key(&source(ChatType::Dm, "42", Some("7"), "42"), d),
            "agent:main:telegram:dm:42:7"
        );
        assert_eq!(
            key(&source(ChatType::Group, "-100987", None, "555"), d),
            "agent:main:telegram:group:-100987:555"
        );
        assert_eq!(
            key(&source(ChatType::Forum, "-100987", Some("17"), "555"), d),
            "agent:main:telegram:forum:-100987:17"
        );
        let shared = KeyPolicy {
            group_sessions_per_user: false,
            thread_sessions_per_user: false,
        };
        assert_eq!(
            key(&source(ChatType::Group, "-100987", None, "555"), shared),
            "agent:main:telegram:group:-100987"
        );
        let per_thread = KeyPolicy {
            group_sessions_per_user: true,
            thread_sessions_per_user: true,
        };
        assert_eq!(
            key(&source(ChatType::Thread, "C", Some("T"), "U"), per_thread),
            "agent:main:telegram:thread:C:T:U"
        );
        let k = SessionKey::for_source(&source(ChatType::Dm, "42", None, "42"), d).unwrap();
        assert_eq!(k.platform(), "telegram");
    }

    #[test]
    fn unsafe_ids_are_refused_and_interior_slashes_kept() {
        let d = KeyPolicy::default();
        assert!(SessionKey::for_source(&source(ChatType::Dm, "..", None, "1"), d).is_err());
        assert!(SessionKey::for_source(&source(ChatType::Dm, "a\nb", None, "1"), d).is_err());
        assert!(SessionKey::for_source(&source(ChatType::Group, "c", None, ".."), d).is_err());
        let k = key(
            &source(ChatType::Group, "spaces/X", Some("threads/Y"), "u"),
            d,
        );
        assert_eq!(k, "agent:main:telegram:group:spaces/X:threads/Y");
        assert!(SessionKey::parse("/etc/passwd").is_err());
        assert!(SessionKey::parse("agent:main:x:dm:../y").is_err());
    }
}
