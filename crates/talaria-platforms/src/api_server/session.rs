//! Which stored session a request continues, and opening it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use axum::http::HeaderMap;
use sha2::{Digest, Sha256};
use talaria_agent::{Agent, AgentError, SessionHandle};
use talaria_core::Message;
use talaria_store::NewSession;

use super::error::ApiError;

/// The session header; the Hermes spelling is accepted for clients written
/// against it.
pub(crate) const SESSION_HEADER: &str = "x-talaria-session-id";
/// The Hermes spelling of [`SESSION_HEADER`].
pub(crate) const HERMES_SESSION_HEADER: &str = "x-hermes-session-id";

/// Longest session id a client may send: the store's limit for ids, which
/// become file names (the ancestor allowed 256; longer ids than this are
/// told they are too long rather than merely invalid).
const MAX_HEADER_ID_LEN: usize = talaria_core::ids::MAX_ID_LEN;

/// What sessions created here are marked with.
const SOURCE: &str = "api_server";

/// The session id the client chose, if it sent one.
///
/// # Errors
/// 400 when the header is present but unsafe as an id.
pub(crate) fn header_session_id(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers
        .get(SESSION_HEADER)
        .or_else(|| headers.get(HERMES_SESSION_HEADER))
    else {
        return Ok(None);
    };
    let invalid = || ApiError::bad_request("Invalid session ID", "invalid_session_id");
    // Non-ASCII bytes fail here, before they can reach any check below.
    let raw = value.to_str().map_err(|_| invalid())?.trim();
    if raw.len() > MAX_HEADER_ID_LEN {
        return Err(ApiError::bad_request(
            "Session ID too long",
            "invalid_session_id",
        ));
    }
    // Checked explicitly as well as by the path validator, so loosening that
    // validator one day cannot open a traversal here.
    if raw.is_empty()
        || raw.contains(['/', '\\'])
        || raw.contains("..")
        || raw.chars().any(char::is_control)
    {
        return Err(invalid());
    }
    talaria_core::ids::validate_path_component(raw).map_err(|_| invalid())?;
    Ok(Some(raw.to_owned()))
}

/// `api-` + the first 16 hex digits of SHA-256(`<system>\n<first user>`):
/// the same conversation resent with one more turn maps to the same session.
pub(crate) fn derived_session_id(system: &str, first_user: &str) -> String {
    let digest = Sha256::digest(format!("{system}\n{first_user}").as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("api-{hex}")
}

/// One async lock per session id, so two requests for the same session
/// take turns (the agent's own per-handle lock does not cover two handles
/// opened by two requests). Entries die with their last holder.
#[derive(Default)]
pub(crate) struct SessionLocks {
    map: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

impl SessionLocks {
    /// The lock for `id`, shared with every other request holding it now.
    pub(crate) fn get(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        // The map holds no invariant a panic could break half-way.
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(lock) = map.get(id).and_then(Weak::upgrade) {
            return lock;
        }
        map.retain(|_, w| w.strong_count() > 0);
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        map.insert(id.to_owned(), Arc::downgrade(&lock));
        lock
    }
}

/// Opens session `id`, creating it when the store does not know it; a new
/// session gets `seed` (the conversation the client already had) stored
/// first. The caller holds the session's lock.
pub(crate) async fn open_session(
    agent: &Agent,
    id: &str,
    seed: &[Message],
) -> Result<SessionHandle, AgentError> {
    match agent.resume_session(id).await {
        Err(AgentError::NoSuchSession(_)) => {}
        other => return other,
    }
    let handle = match agent
        .start_session(NewSession {
            id: id.to_owned(),
            source: SOURCE.to_owned(),
            ..NewSession::default()
        })
        .await
    {
        Ok(handle) => handle,
        // Another process may have created it in between: use theirs, and
        // leave seeding to whoever created it.
        Err(create_err) => {
            return agent.resume_session(id).await.map_err(|_| create_err);
        }
    };
    let store = &agent.parts().store;
    for message in seed {
        store.append_message(id, message).await?;
    }
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with(name: &'static str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_str(value) {
            h.insert(name, v);
        }
        h
    }

    #[test]
    fn header_ids_are_strict() {
        assert_eq!(header_session_id(&HeaderMap::new()).ok(), Some(None));
        assert_eq!(
            header_session_id(&with(SESSION_HEADER, "s1")).ok(),
            Some(Some("s1".to_owned()))
        );
        assert_eq!(
            header_session_id(&with(HERMES_SESSION_HEADER, "abc_1-2.x")).ok(),
            Some(Some("abc_1-2.x".to_owned()))
        );
        for bad in ["../x", "a/b", "a\\b", "..", ".hidden", "a b", "x..y", "-rf"] {
            let err = header_session_id(&with(SESSION_HEADER, bad)).err();
            assert_eq!(
                err.map(|e| e.message),
                Some("Invalid session ID".to_owned()),
                "{bad:?}"
            );
        }
        let long = "a".repeat(257);
        let err = header_session_id(&with(SESSION_HEADER, &long)).err();
        assert_eq!(
            err.map(|e| e.message),
            Some("Session ID too long".to_owned())
        );
    }

    #[test]
    fn derived_ids_are_stable_and_safe() {
        let a = derived_session_id("sys", "hello");
        assert_eq!(a, derived_session_id("sys", "hello"));
        assert_ne!(a, derived_session_id("sys", "hello!"));
        assert_ne!(a, derived_session_id("", "sys\nhello!"));
        assert_eq!(a.len(), "api-".len() + 16);
        assert!(talaria_core::ids::validate_path_component(&a).is_ok());
    }

    #[test]
    fn locks_are_shared_while_held_and_dropped_after() {
        let locks = SessionLocks::default();
        let a = locks.get("s");
        let b = locks.get("s");
        assert!(Arc::ptr_eq(&a, &b));
        drop((a, b));
        let _c = locks.get("t");
        let map = locks.map.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(!map.contains_key("s"));
    }
}
