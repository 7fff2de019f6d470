//! Which stored session a request continues, and opening it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use axum::http::HeaderMap;
use rand::Rng;
use sha2::{Digest, Sha256};
use talaria_agent::{Agent, AgentError, SessionHandle};
use talaria_core::{Message, Role};
use talaria_store::{CursorStore, NewSession};

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
pub(crate) const SOURCE: &str = "api_server";

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
    // Non-ASCII bytes fail here, before they can reach any check below.
    let raw = value
        .to_str()
        .map_err(|_| ApiError::bad_request("Invalid session ID", "invalid_session_id"))?;
    validate_client_id(raw).map(Some)
}

/// A session id a client sent (header, body or path), trimmed, when it is
/// safe as a stored id and a file name.
///
/// # Errors
/// 400 `invalid_session_id` when it is empty, too long or unsafe.
pub(crate) fn validate_client_id(raw: &str) -> Result<String, ApiError> {
    let invalid = || ApiError::bad_request("Invalid session ID", "invalid_session_id");
    let raw = raw.trim();
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
    Ok(raw.to_owned())
}

/// A fresh id for a header-less conversation: `api-` + 32 hex digits, the
/// first 12 the milliseconds since 1970, the other 20 random (80 bits).
/// Never derived from the request: a conversation the server has not seen
/// must not land in a session someone else's request created.
///
/// Time first, because the id keys every stored row of the session: ids
/// of conversations started about the same time sort together, so the
/// rows the conversations running now append land in the same few index
/// pages instead of one random page each (wholly random ids wrote a sixth
/// more bytes per turn under load).
pub(crate) fn new_conversation_id() -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let random: u128 = rand::rng().random_range(0..(1u128 << 80));
    format!("api-{:012x}{random:020x}", millis & 0xffff_ffff_ffff)
}

/// A running SHA-256 over a header-less conversation as the client sends
/// it: the client's system text, then each user and assistant message.
/// Each field is length-prefixed, so no two different conversations hash
/// the same bytes; contents are trimmed, so a client that strips the
/// whitespace around an answer it was sent still matches.
#[derive(Clone)]
pub(crate) struct TranscriptDigest {
    hasher: Sha256,
    /// The index key this conversation continued from, which its next
    /// record replaces.
    replaces: Option<String>,
}

impl TranscriptDigest {
    /// The digest of a conversation with this system text and no message.
    pub(crate) fn new(system: &str) -> TranscriptDigest {
        let mut digest = TranscriptDigest {
            hasher: Sha256::new(),
            replaces: None,
        };
        digest.field(b"talaria.api.transcript.v1");
        digest.field(system.trim().as_bytes());
        digest
    }

    fn field(&mut self, bytes: &[u8]) {
        self.hasher.update((bytes.len() as u64).to_be_bytes());
        self.hasher.update(bytes);
    }

    /// The same digest, whose record will replace the index entry `key`.
    pub(crate) fn replacing(mut self, key: String) -> TranscriptDigest {
        self.replaces = Some(key);
        self
    }

    /// The index key this digest's record replaces, if any.
    pub(crate) fn replaces(&self) -> Option<&str> {
        self.replaces.as_deref()
    }

    /// Adds one message.
    pub(crate) fn push(&mut self, role: Role, content: &str) {
        self.field(role.as_str().as_bytes());
        self.field(content.trim().as_bytes());
    }

    /// Adds every message.
    pub(crate) fn extend(&mut self, messages: &[Message]) {
        for m in messages {
            self.push(m.role, &m.content);
        }
    }

    /// The index key of the conversation so far.
    pub(crate) fn key(&self) -> String {
        let digest = self.hasher.clone().finalize();
        format!("transcript:{}", talaria_core::ids::to_hex(&digest))
    }
}

/// Where a header-less conversation was left: its session, and how many
/// rows that session held when the answer the client resends was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Continuation {
    pub(crate) session_id: String,
    pub(crate) rows: u64,
}

impl Continuation {
    fn encode(&self) -> String {
        format!("{} {}", self.rows, self.session_id)
    }

    fn decode(value: &str) -> Option<Continuation> {
        let (rows, id) = value.split_once(' ')?;
        talaria_core::ids::validate_path_component(id).ok()?;
        Some(Continuation {
            session_id: id.to_owned(),
            rows: rows.parse().ok()?,
        })
    }
}

/// The cursor namespace the index lives under.
const INDEX_NAMESPACE: &str = "api_server";

/// Maps the digest of a whole conversation (up to and including an answer
/// the server gave) to the session holding it, so a client that resends
/// its history continues that session. Kept in the store, so continuity
/// survives a restart and spans the nodes of a shared store. Without a
/// store every header-less request starts a session of its own, which is
/// still correct: the model gets what the client sent.
///
/// With a store several nodes share, each record is written at once:
/// another node may get the client's next request a moment later. The
/// embedded store is this process's alone, and a record written per turn
/// cost a random index page or two per turn (a sixth of the bytes a turn
/// wrote): there records are kept in memory and written
/// [`SAVE_EVERY`], only the latest of each conversation, and at shutdown
/// ([`TranscriptIndex::save`]). A crash loses the last second's records;
/// those clients' next requests then start sessions of their own, seeded
/// with what they send, so the model still sees their whole conversation.
#[derive(Default)]
pub(crate) struct TranscriptIndex {
    store: OnceLock<Arc<dyn CursorStore>>,
    /// Whether each record is written as it is made (a shared store).
    write_through: OnceLock<bool>,
    /// The entries this process recorded last, so a client that continues
    /// here (the usual case) is found without a store read. Only a hint:
    /// [`continue_if_unchanged`] checks the session against the store
    /// either way, so an entry another node has since moved past is
    /// harmless.
    recent: Mutex<Recent>,
    /// Records not written yet, by session (embedded store only).
    unsaved: Mutex<HashMap<String, Unsaved>>,
}

/// How often an embedded store gets the records made since the last write.
pub(crate) const SAVE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// A conversation's newest record, not yet in the store.
struct Unsaved {
    /// The key the store holds for the conversation, which the record
    /// replaces.
    stored: Option<String>,
    key: String,
    at: Continuation,
}

/// Entries kept in memory: bounded, the oldest recorded dropped first.
#[derive(Default)]
struct Recent {
    map: HashMap<String, Continuation>,
    order: std::collections::VecDeque<String>,
}

/// Conversations whose index entry stays in memory.
const RECENT_ENTRIES: usize = 4096;

impl Recent {
    fn insert(&mut self, key: &str, at: &Continuation) {
        if self.map.insert(key.to_owned(), at.clone()).is_none() {
            self.order.push_back(key.to_owned());
        }
        // The order may hold keys already removed: they are skipped here.
        while self.map.len() > RECENT_ENTRIES {
            match self.order.pop_front() {
                Some(old) => {
                    self.map.remove(&old);
                }
                None => break,
            }
        }
        if self.order.len() > 2 * RECENT_ENTRIES {
            let map = &self.map;
            self.order.retain(|k| map.contains_key(k));
        }
    }
}

impl TranscriptIndex {
    /// Keeps the index in `store` from now on, each record written at once
    /// when `shared` (other nodes read it too), else every [`SAVE_EVERY`].
    /// A second call changes nothing.
    pub(crate) fn attach(&self, store: Arc<dyn CursorStore>, shared: bool) {
        if self.store.set(store).is_ok() {
            let _ = self.write_through.set(shared);
        }
    }

    /// Where the conversation with this key was left, if anywhere. A store
    /// failure reads as "nowhere": the request then starts a session of its
    /// own, which loses continuity but never mixes conversations.
    pub(crate) async fn lookup(&self, key: &str) -> Option<Continuation> {
        let store = self.store.get()?;
        let known = self
            .recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .map
            .get(key)
            .cloned();
        if known.is_some() {
            return known;
        }
        match store.cursor(INDEX_NAMESPACE, key).await {
            Ok(value) => value.as_deref().and_then(Continuation::decode),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the API transcript index");
                None
            }
        }
    }

    /// Records that the conversation with this key is `at`, forgetting
    /// the entry `replaces` it continued from, so the index holds one
    /// entry per conversation however many turns it has.
    pub(crate) async fn record(&self, key: &str, at: &Continuation, replaces: Option<&str>) {
        let Some(store) = self.store.get() else {
            return;
        };
        {
            let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(old) = replaces {
                recent.map.remove(old);
            }
            recent.insert(key, at);
        }
        if self.write_through.get() == Some(&true) {
            write(store.as_ref(), key, at, replaces).await;
            return;
        }
        let mut unsaved = self.unsaved.lock().unwrap_or_else(PoisonError::into_inner);
        match unsaved.entry(at.session_id.clone()) {
            // A record not written yet is replaced in memory: the store
            // still holds the one before it.
            std::collections::hash_map::Entry::Occupied(mut entry) => {
                let entry = entry.get_mut();
                entry.key = key.to_owned();
                entry.at = at.clone();
            }
            std::collections::hash_map::Entry::Vacant(entry) => {
                entry.insert(Unsaved {
                    stored: replaces.map(str::to_owned),
                    key: key.to_owned(),
                    at: at.clone(),
                });
            }
        }
    }

    /// Writes the records not in the store yet, one per conversation.
    pub(crate) async fn save(&self) {
        let Some(store) = self.store.get() else {
            return;
        };
        let batch =
            std::mem::take(&mut *self.unsaved.lock().unwrap_or_else(PoisonError::into_inner));
        // Queued together, so the store commits them together.
        futures::future::join_all(batch.into_values().map(|u| async move {
            write(store.as_ref(), &u.key, &u.at, u.stored.as_deref()).await;
        }))
        .await;
    }

    /// Writes the records every [`SAVE_EVERY`] until `stop` is cancelled
    /// (the last ones are for [`TranscriptIndex::save`] after the server
    /// has stopped). Returns at once for a store written through.
    pub(crate) async fn save_until(&self, stop: tokio_util::sync::CancellationToken) {
        if self.store.get().is_none() || self.write_through.get() == Some(&true) {
            return;
        }
        loop {
            tokio::select! {
                () = tokio::time::sleep(SAVE_EVERY) => self.save().await,
                () = stop.cancelled() => return,
            }
        }
    }
}

/// Stores one record: the old entry goes as the new one is written, in one
/// write. A failure is logged: the conversation's next request then starts
/// a session of its own.
async fn write(store: &dyn CursorStore, key: &str, at: &Continuation, replaces: Option<&str>) {
    let value = at.encode();
    let written = match replaces {
        Some(old) => store.move_cursor(INDEX_NAMESPACE, old, key, &value).await,
        None => store.set_cursor(INDEX_NAMESPACE, key, &value).await,
    };
    if let Err(e) = written {
        tracing::warn!(session = %at.session_id, error = %e, "cannot record the API transcript index");
    }
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

/// Starts session `id` (new, never stored before) with `seed`, the
/// conversation the client already had, stored first.
pub(crate) async fn start_conversation(
    agent: &Agent,
    id: &str,
    seed: &[Message],
) -> Result<SessionHandle, AgentError> {
    let handle = agent
        .start_session(NewSession {
            id: id.to_owned(),
            source: SOURCE.to_owned(),
            ..NewSession::default()
        })
        .await?;
    let store = &agent.parts().store;
    for message in seed {
        store.append_message(id, message).await?;
    }
    Ok(handle)
}

/// Reopens the session `at` names when it still holds exactly the rows it
/// held when the index entry was recorded: no turn has run on it since, so
/// its transcript is the conversation the client resends. `None` when it
/// moved on (another client with the same history continued it) or is
/// gone. The caller holds the session's lock.
pub(crate) async fn continue_if_unchanged(
    agent: &Agent,
    at: &Continuation,
) -> Result<Option<SessionHandle>, AgentError> {
    let Some(record) = agent.parts().store.session(&at.session_id).await? else {
        return Ok(None);
    };
    if record.message_count != at.rows {
        return Ok(None);
    }
    agent.resume_record(record).await.map(Some)
}

/// How many rows session `id` holds now.
pub(crate) async fn stored_rows(agent: &Agent, id: &str) -> Option<u64> {
    match agent.parts().store.session(id).await {
        Ok(record) => record.map(|r| r.message_count),
        Err(e) => {
            tracing::warn!(session = %id, error = %e, "cannot read the API session");
            None
        }
    }
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
    fn conversation_ids_are_fresh_and_safe() {
        let a = new_conversation_id();
        assert_ne!(a, new_conversation_id());
        assert_eq!(a.len(), "api-".len() + 32);
        assert!(talaria_core::ids::validate_path_component(&a).is_ok());
        // A later conversation sorts after an earlier one (a millisecond
        // apart at least), whatever the random part.
        std::thread::sleep(std::time::Duration::from_millis(2));
        for _ in 0..100 {
            assert!(new_conversation_id() > a);
        }
    }

    fn key(system: &str, messages: &[(Role, &str)]) -> String {
        let mut d = TranscriptDigest::new(system);
        for (role, text) in messages {
            d.push(*role, text);
        }
        d.key()
    }

    fn at(session: &str, rows: u64) -> Continuation {
        Continuation {
            session_id: session.to_owned(),
            rows,
        }
    }

    fn sqlite() -> (tempfile::TempDir, Arc<talaria_store::SqliteStore>) {
        let dir = tempfile::tempdir().unwrap();
        let store = talaria_store::SqliteStore::open(&dir.path().join("state.db")).unwrap();
        (dir, Arc::new(store))
    }

    async fn stored(store: &talaria_store::SqliteStore, key: &str) -> Option<Continuation> {
        let value = store.cursor(INDEX_NAMESPACE, key).await.unwrap();
        value.as_deref().and_then(Continuation::decode)
    }

    /// The embedded store gets each conversation's newest record when the
    /// records are saved, not one write per turn; lookups find the newest
    /// in memory meanwhile.
    #[tokio::test]
    async fn an_embedded_store_gets_the_newest_record_of_each_conversation_when_saved() {
        let (_dir, store) = sqlite();
        let index = TranscriptIndex::default();
        index.attach(store.clone(), false);
        index.record("k1", &at("s1", 2), None).await;
        index.record("x1", &at("s2", 2), None).await;
        assert_eq!(stored(&store, "k1").await, None);
        assert_eq!(index.lookup("k1").await, Some(at("s1", 2)));
        index.save().await;
        assert_eq!(stored(&store, "k1").await, Some(at("s1", 2)));
        assert_eq!(stored(&store, "x1").await, Some(at("s2", 2)));

        // Two more turns of the first conversation: the store keeps the
        // saved record until the next save, which writes only the newest
        // and drops the one it replaces.
        index.record("k2", &at("s1", 4), Some("k1")).await;
        index.record("k3", &at("s1", 6), Some("k2")).await;
        assert_eq!(stored(&store, "k3").await, None);
        assert_eq!(index.lookup("k3").await, Some(at("s1", 6)));
        assert_eq!(
            index.lookup("k1").await,
            Some(at("s1", 2)),
            "from the store"
        );
        index.save().await;
        assert_eq!(stored(&store, "k3").await, Some(at("s1", 6)));
        assert_eq!(stored(&store, "k2").await, None);
        assert_eq!(stored(&store, "k1").await, None);
        assert_eq!(stored(&store, "x1").await, Some(at("s2", 2)));

        // A fresh process (nothing in memory) finds what was saved.
        let after_restart = TranscriptIndex::default();
        after_restart.attach(store.clone(), false);
        assert_eq!(after_restart.lookup("k3").await, Some(at("s1", 6)));
    }

    /// Records are saved every second while the server runs, without
    /// waiting for it to stop; saving ends when told to.
    #[tokio::test]
    async fn records_are_saved_every_second_until_stopped() {
        let (_dir, store) = sqlite();
        let index = Arc::new(TranscriptIndex::default());
        index.attach(store.clone(), false);
        let stop = tokio_util::sync::CancellationToken::new();
        let saving = tokio::spawn({
            let (index, stop) = (index.clone(), stop.clone());
            async move { index.save_until(stop).await }
        });
        index.record("k1", &at("s1", 2), None).await;
        let deadline = std::time::Instant::now() + 3 * SAVE_EVERY;
        while stored(&store, "k1").await.is_none() {
            assert!(std::time::Instant::now() < deadline, "never saved");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        stop.cancel();
        tokio::time::timeout(std::time::Duration::from_secs(5), saving)
            .await
            .unwrap()
            .unwrap();
    }

    /// With a store other nodes read, each record is written at once.
    #[tokio::test]
    async fn a_shared_store_gets_every_record_at_once() {
        let (_dir, store) = sqlite();
        let index = TranscriptIndex::default();
        index.attach(store.clone(), true);
        index.record("k1", &at("s1", 2), None).await;
        assert_eq!(stored(&store, "k1").await, Some(at("s1", 2)));
        index.record("k2", &at("s1", 4), Some("k1")).await;
        assert_eq!(stored(&store, "k2").await, Some(at("s1", 4)));
        assert_eq!(stored(&store, "k1").await, None);
        // Nothing waits for a save.
        tokio::time::timeout(
            std::time::Duration::from_secs(1),
            index.save_until(tokio_util::sync::CancellationToken::new()),
        )
        .await
        .unwrap();
    }

    #[test]
    fn transcript_keys_cover_the_whole_conversation() {
        let opening = [(Role::User, "hi"), (Role::Assistant, "Hello!")];
        let a = key("sys", &opening);
        assert_eq!(a, key("sys", &opening));
        assert_eq!(
            a,
            key(
                " sys",
                &[(Role::User, "hi "), (Role::Assistant, "\nHello!")]
            )
        );
        // A different answer, system text, role or boundary is another key.
        assert_ne!(
            a,
            key("sys", &[(Role::User, "hi"), (Role::Assistant, "Hey!")])
        );
        assert_ne!(a, key("", &opening));
        assert_ne!(
            a,
            key("sys", &[(Role::Assistant, "hi"), (Role::User, "Hello!")])
        );
        assert_ne!(a, key("sys", &[(Role::User, "hiHello!")]));
        assert_ne!(a, key("sys", &opening[..1]));
        // Pushing one by one is extending at once.
        let mut d = TranscriptDigest::new("sys");
        d.extend(&[Message::user("hi"), Message::assistant("Hello!")]);
        assert_eq!(d.key(), a);
    }

    #[test]
    fn continuations_round_trip_and_refuse_unsafe_ids() {
        let at = Continuation {
            session_id: "api-00ff".into(),
            rows: 12,
        };
        assert_eq!(Continuation::decode(&at.encode()), Some(at));
        assert_eq!(Continuation::decode("12 ../x"), None);
        assert_eq!(Continuation::decode("x api-1"), None);
        assert_eq!(Continuation::decode("12"), None);
    }

    #[test]
    fn recent_entries_are_bounded_oldest_first() {
        let mut recent = Recent::default();
        let at = |n: u64| Continuation {
            session_id: format!("api-{n}"),
            rows: n,
        };
        for n in 0..(RECENT_ENTRIES as u64 + 10) {
            recent.insert(&format!("k{n}"), &at(n));
        }
        assert_eq!(recent.map.len(), RECENT_ENTRIES);
        assert!(!recent.map.contains_key("k0") && !recent.map.contains_key("k9"));
        assert_eq!(recent.map.get("k10"), Some(&at(10)));
        // Keys removed by a later record do not hold the order up.
        for n in 0..(3 * RECENT_ENTRIES as u64) {
            let key = format!("r{n}");
            recent.insert(&key, &at(n));
            recent.map.remove(&key);
        }
        assert!(recent.order.len() <= 2 * RECENT_ENTRIES + 1);
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
