//! Whose conversation an event belongs to, and so where its commands run.
//!
//! Only the owner's own DMs get `terminal.backend` (the host, by default).
//! Everything else is untrusted and gets `terminal.untrusted_backend` (the
//! sandbox): group chats and threads, whoever writes in them, because
//! everyone there steers the conversation; DMs from people let in by a
//! pairing code, a `*` or an allow-all flag; bots. The owners are
//! `gateway.owners.<platform>`, or, for a platform it does not mention,
//! the ids written out on `<PLATFORM>_ALLOWED_USERS` and
//! `GATEWAY_ALLOWED_USERS`.

use talaria_adapter::auth::AuthPolicy;
use talaria_adapter::{Capabilities, ChatType, SessionSource};
use talaria_core::config::{GatewayConfig, WorkspaceScope};
use talaria_exec::{BackendKind, Backends, Trust};

/// Whose conversation `source` is.
pub fn trust(
    source: &SessionSource,
    caps: &Capabilities,
    config: &GatewayConfig,
    auth: &AuthPolicy,
) -> Trust {
    if source.chat_type != ChatType::Dm || source.is_bot {
        return Trust::Untrusted;
    }
    let Some(user) = source
        .user_id
        .as_deref()
        .map(str::trim)
        .filter(|u| !u.is_empty())
    else {
        return Trust::Untrusted;
    };
    let owner = match config.owners.get(&source.platform.to_ascii_lowercase()) {
        Some(owners) => owners.iter().any(|o| {
            let o = o.trim();
            o == "*" || o == user
        }),
        None => auth.names_sender(source, caps),
    };
    if owner {
        Trust::Owner
    } else {
        Trust::Untrusted
    }
}

/// The key a conversation's workspace (and container) is kept under:
/// the session's id, or the chat's session key.
pub fn scope<'a>(scope: WorkspaceScope, session_key: &'a str, session_id: &'a str) -> &'a str {
    match scope {
        WorkspaceScope::Session => session_id,
        WorkspaceScope::Chat => session_key,
    }
}

/// One line for `/status`: where this conversation's commands run.
pub fn describe(backends: &Backends, trust: Trust) -> String {
    let kind = backends.kind_for(trust);
    let place = match kind {
        BackendKind::Local => "on the gateway's machine (local)",
        BackendKind::Sandbox => "in a bubblewrap sandbox (sandbox), files in /workspace",
        BackendKind::Docker => "in a container (docker), files in /workspace",
        BackendKind::Ssh => "on a remote host (ssh)",
    };
    match backends.unavailable_reason(kind) {
        Some(why) => format!("Commands: none in this chat: the {kind} backend can't start ({why})"),
        None if trust == Trust::Owner => format!("Commands: {place}"),
        None => format!("Commands: {place}; this chat is not an owner's DM"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use talaria_core::Env;

    fn caps() -> Capabilities {
        crate::runner::UNREGISTERED
    }

    fn auth(pairs: &[(&str, &str)]) -> AuthPolicy {
        AuthPolicy::from_env(&Env::from_pairs(pairs.iter().copied()))
    }

    #[test]
    fn the_allowlisted_owner_is_trusted_in_a_dm_only() {
        let a = auth(&[("TELEGRAM_ALLOWED_USERS", "42")]);
        let cfg = GatewayConfig::default();
        let dm = SessionSource::dm("telegram", "42", "42");
        assert_eq!(trust(&dm, &caps(), &cfg, &a), Trust::Owner);
        let mut group = dm.clone();
        group.chat_type = ChatType::Group;
        group.chat_id = "-100".into();
        assert_eq!(trust(&group, &caps(), &cfg, &a), Trust::Untrusted);
        let stranger = SessionSource::dm("telegram", "7", "7");
        assert_eq!(trust(&stranger, &caps(), &cfg, &a), Trust::Untrusted);
    }

    #[test]
    fn a_wildcard_or_allow_all_trusts_nobody_but_owners_do() {
        let a = auth(&[
            ("TELEGRAM_ALLOWED_USERS", "*"),
            ("GATEWAY_ALLOW_ALL_USERS", "true"),
        ]);
        let mut cfg = GatewayConfig::default();
        let dm = SessionSource::dm("telegram", "42", "42");
        assert_eq!(trust(&dm, &caps(), &cfg, &a), Trust::Untrusted);
        cfg.owners.insert("telegram".into(), vec!["42".into()]);
        assert_eq!(trust(&dm, &caps(), &cfg, &a), Trust::Owner);
        // Owners named for the platform replace the allowlist's reading.
        let a = auth(&[("TELEGRAM_ALLOWED_USERS", "7")]);
        let seven = SessionSource::dm("telegram", "7", "7");
        assert_eq!(trust(&seven, &caps(), &cfg, &a), Trust::Untrusted);
    }

    #[test]
    fn a_bot_is_never_the_owner() {
        let a = auth(&[("TELEGRAM_ALLOWED_USERS", "42")]);
        let mut dm = SessionSource::dm("telegram", "42", "42");
        dm.is_bot = true;
        assert_eq!(
            trust(&dm, &caps(), &GatewayConfig::default(), &a),
            Trust::Untrusted
        );
    }
}
