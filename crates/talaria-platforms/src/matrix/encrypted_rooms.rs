//! The adapter's side of end-to-end encryption: setting up the device's
//! keys at connect time, knowing which rooms are encrypted, sealing what
//! goes into them, opening what comes out, and holding a message whose
//! room key has not arrived until it does.

use std::collections::{BTreeSet, VecDeque};
use std::path::PathBuf;
use std::time::Instant;

use super::config::{DeviceTrust, E2eeMode};
use super::e2ee::{Crypto, CryptoError, Recipients, Undecrypted};
use super::*;

/// A message whose room key had not arrived is kept this long, waiting.
const HOLD_FOR: Duration = Duration::from_secs(30 * 60);

/// At most this many messages wait for their keys; the oldest go first.
const MAX_HELD: usize = 256;

/// The largest plaintext sealed into one event: the ciphertext is base64
/// (a third larger) and must fit the 64 KiB event with its envelope.
pub(super) const MAX_SEALED_BYTES: usize = 44_000;

/// What the operator chose for encryption (see `config`).
#[derive(Debug, Clone, Default)]
pub struct E2eeSettings {
    /// `off`, `optional` or `required`.
    pub mode: E2eeMode,
    /// The device the token must belong to, when set.
    pub device_id: Option<String>,
    /// Which devices get keys and are read from.
    pub trust: DeviceTrust,
    /// Where the devices' key stores live (`platforms/matrix/crypto` in the
    /// home); `None` turns encryption off (a build without a home, as
    /// `talaria doctor`'s).
    pub store_root: Option<PathBuf>,
}

/// Whether encryption is ready.
pub(super) enum CryptoState {
    /// `run` has not set it up yet.
    NotYet,
    /// Off by choice or after a failed setup, and why.
    Off(String),
    Ready(Arc<Crypto>),
}

/// A message waiting for its room key.
pub(super) struct Held {
    room_id: String,
    event: Value,
    is_dm: bool,
    session_id: String,
    since: Instant,
}

/// Messages waiting for their room keys, oldest first.
#[derive(Default)]
pub(super) struct HeldEvents {
    queue: VecDeque<Held>,
}

impl HeldEvents {
    fn hold(&mut self, held: Held) {
        while self.queue.len() >= MAX_HELD {
            if let Some(dropped) = self.queue.pop_front() {
                tracing::warn!(room = %dropped.room_id, "gave up on an encrypted message: its room key never arrived (too many messages were waiting)");
            }
        }
        self.queue.push_back(held);
    }

    /// Takes the messages of `sessions` out, and drops the expired ones.
    fn take(&mut self, sessions: &BTreeSet<String>) -> Vec<Held> {
        let now = Instant::now();
        let mut ready = Vec::new();
        let mut kept = VecDeque::with_capacity(self.queue.len());
        for held in self.queue.drain(..) {
            if sessions.contains(&held.session_id) {
                ready.push(held);
            } else if now.duration_since(held.since) > HOLD_FOR {
                tracing::warn!(room = %held.room_id, "gave up on an encrypted message: its room key did not arrive within 30 minutes (the sender's device did not share it with this one)");
            } else {
                kept.push_back(held);
            }
        }
        self.queue = kept;
        ready
    }
}

/// Why a sync batch's keys were not taken.
pub(super) enum KeysNotTaken {
    /// The gateway is stopping.
    Stopped,
    /// Keeping them failed; the batch should be synced again.
    Retry(String),
}

/// Why encryption could not be set up.
enum SetupError {
    /// For good, until the operator acts: a lost store, another device.
    Refused(String),
    /// The homeserver could not be asked; the next connect tries again.
    Unreachable(String),
}

/// How an encrypted event was opened.
pub(super) enum Opened {
    /// The event it carried.
    Plain(Value),
    /// Not now: held for its key, or refused (and logged).
    Not,
}

impl MatrixAdapter {
    /// Encryption's engine when it is ready.
    pub(super) fn crypto(&self) -> Option<Arc<Crypto>> {
        match &*lock(&self.crypto) {
            CryptoState::Ready(c) => Some(c.clone()),
            _ => None,
        }
    }

    /// Sets encryption up for the account behind the token, once per
    /// process: the device's store opened, its published keys checked, its
    /// keys uploaded. `required` makes a failure fatal; `optional` logs it
    /// and goes on without encrypted rooms.
    pub(super) async fn set_up_crypto(&self, me: &Me) -> Result<(), AdapterError> {
        if !matches!(*lock(&self.crypto), CryptoState::NotYet) {
            return Ok(());
        }
        let settings = &self.e2ee;
        let outcome = match (&settings.store_root, settings.mode) {
            (_, E2eeMode::Off) => Err(SetupError::Refused(
                "encryption is off (platforms.matrix.encryption / MATRIX_E2EE_MODE)".to_owned(),
            )),
            (None, _) => Err(SetupError::Refused(
                "no home to keep the device's keys in".to_owned(),
            )),
            (Some(root), _) => self.open_crypto(me, root).await,
        };
        let state = match outcome {
            Ok(crypto) => {
                tracing::info!(
                    device = %me.device_id.as_deref().unwrap_or(""),
                    fingerprint = %crypto.fingerprint(),
                    "Matrix end-to-end encryption is on"
                );
                CryptoState::Ready(Arc::new(crypto))
            }
            // Not a verdict on encryption: the supervisor connects again
            // later, as after a failed sync, rather than going on without.
            Err(SetupError::Unreachable(why)) => {
                return Err(AdapterError::Disconnected(format!(
                    "cannot check the Matrix device's keys on the homeserver: {why}"
                )));
            }
            Err(SetupError::Refused(why)) if settings.mode == E2eeMode::Required => {
                return Err(AdapterError::Fatal(format!(
                    "Matrix end-to-end encryption is required but cannot be set up: {why}"
                )));
            }
            Err(SetupError::Refused(why)) => {
                if settings.mode != E2eeMode::Off {
                    tracing::warn!(
                        "Matrix end-to-end encryption is unavailable, so encrypted rooms are ignored: {why}"
                    );
                }
                CryptoState::Off(why)
            }
        };
        *lock(&self.crypto) = state;
        Ok(())
    }

    async fn open_crypto(&self, me: &Me, root: &std::path::Path) -> Result<Crypto, SetupError> {
        let Some(device) = me.device_id.as_deref() else {
            return Err(SetupError::Refused(
                "the homeserver did not say which device the access token belongs to \
                 (whoami has no device_id)"
                    .to_owned(),
            ));
        };
        if let Some(expected) = &self.e2ee.device_id
            && expected != device
        {
            return Err(SetupError::Refused(format!(
                "the access token belongs to device {device}, not to MATRIX_DEVICE_ID {expected}"
            )));
        }
        let crypto = Crypto::open(
            self.api.clone(),
            self.token.clone(),
            root,
            &me.user_id,
            device,
            self.e2ee.trust,
        )
        .await
        .map_err(|e| SetupError::Refused(e.to_string()))?;
        crypto.check_published_keys().await.map_err(|e| match e {
            // No answer, a busy or failing server: ask again later. A
            // refusal (a server without the key endpoints) is final.
            CryptoError::Api(e)
                if api::is_rate_limit(&e) || e.status().is_none_or(|s| s >= 500) =>
            {
                SetupError::Unreachable(e.to_string())
            }
            other => SetupError::Refused(other.to_string()),
        })?;
        crypto.flush().await;
        Ok(crypto)
    }

    /// Feeds a sync batch to the machine and sends what it asks; then
    /// hands over the held messages whose keys came with the batch.
    pub(super) async fn take_keys(
        &self,
        batch: &Value,
        me: &Me,
        ctx: &AdapterContext,
    ) -> Result<(), KeysNotTaken> {
        let Some(crypto) = self.crypto() else {
            return Ok(());
        };
        let sessions = match crypto.receive(batch).await {
            Ok(s) => s,
            Err(CryptoError::Malformed(e)) => {
                tracing::warn!("skipping this sync's encryption changes: {e}");
                BTreeSet::new()
            }
            // The store could not keep them (a full disk, say): the batch
            // is synced again rather than its room keys lost for good.
            Err(e) => return Err(KeysNotTaken::Retry(e.to_string())),
        };
        crypto.flush().await;
        let ready = lock(&self.held).take(&sessions);
        for held in ready {
            match crypto.decrypt(&held.room_id, &held.event).await {
                Ok(plain) => {
                    tracing::debug!(room = %held.room_id, "a held encrypted message can be read now");
                    self.deliver(&held.room_id, &plain, held.is_dm, me, ctx)
                        .await
                        .map_err(|()| KeysNotTaken::Stopped)?;
                }
                Err(e) => self.not_opened(&held.room_id, &held.event, held.is_dm, e),
            }
        }
        Ok(())
    }

    /// Opens an `m.room.encrypted` event of `room_id`.
    pub(super) async fn open(&self, room_id: &str, event: &Value, is_dm: bool) -> Opened {
        let Some(crypto) = self.crypto() else {
            if lock(&self.rooms)
                .warned_encrypted
                .insert(room_id.to_owned())
            {
                let why = match &*lock(&self.crypto) {
                    CryptoState::Off(why) => why.clone(),
                    _ => "encryption is not set up yet".to_owned(),
                };
                tracing::warn!(room = %room_id, "this room is end-to-end encrypted and its messages are ignored: {why}");
            }
            return Opened::Not;
        };
        match crypto.decrypt(room_id, event).await {
            Ok(plain) => Opened::Plain(plain),
            Err(e) => {
                self.not_opened(room_id, event, is_dm, e);
                Opened::Not
            }
        }
    }

    fn not_opened(&self, room_id: &str, event: &Value, is_dm: bool, why: Undecrypted) {
        let event_id = event.get("event_id").and_then(Value::as_str).unwrap_or("");
        match why {
            Undecrypted::MissingKey { session_id } => {
                tracing::info!(room = %room_id, event = %event_id, "an encrypted message arrived before its room key; it waits for the key");
                lock(&self.held).hold(Held {
                    room_id: room_id.to_owned(),
                    event: event.clone(),
                    is_dm,
                    session_id,
                    since: Instant::now(),
                });
            }
            Undecrypted::Refused(why) => {
                tracing::warn!(room = %room_id, event = %event_id, "cannot read an encrypted message: {why}");
            }
        }
    }

    /// The room's `m.room.encryption` content, or `None` for a room
    /// without encryption; asked from the homeserver the first time.
    pub(super) async fn room_encryption(&self, room_id: &str) -> Result<Option<Value>, SendError> {
        if let Some(known) = lock(&self.encryption).get(room_id) {
            return Ok(known.clone());
        }
        let path = format!("/rooms/{}/state/m.room.encryption/", segment(room_id));
        let known = match self
            .api
            .request::<Value>(Method::GET, &path, &[], None, REQUEST_TIMEOUT)
            .await
        {
            Ok(content) if content.get("algorithm").is_some() => Some(content),
            Ok(_) => None,
            Err(e) if e.status() == Some(404) => None,
            Err(e) => return Err(classify(e)),
        };
        self.set_encryption(room_id, known.clone());
        Ok(known)
    }

    /// Records what a room's encryption state is. Encryption cannot be
    /// switched off, so a known encrypted room stays so; an unencrypted
    /// one changes when its `m.room.encryption` event arrives in a sync.
    pub(super) fn set_encryption(&self, room_id: &str, content: Option<Value>) {
        let mut rooms = lock(&self.encryption);
        if rooms.len() >= MAX_REMEMBERED && !rooms.contains_key(room_id) {
            rooms.clear();
        }
        rooms.insert(room_id.to_owned(), content);
    }

    /// `content` of type `kind` as it goes into `room_id`: unchanged in a
    /// room without encryption, else encrypted for the room's members'
    /// devices. Never sends plaintext into an encrypted room.
    pub(super) async fn seal(
        &self,
        room_id: &str,
        kind: &'static str,
        content: Value,
    ) -> Result<(&'static str, Value), SendError> {
        let Some(encryption) = self.room_encryption(room_id).await? else {
            return Ok((kind, content));
        };
        let crypto = match &*lock(&self.crypto) {
            CryptoState::Ready(c) => c.clone(),
            CryptoState::NotYet => {
                return Err(SendError::Unavailable(
                    "the room is end-to-end encrypted and encryption is not set up yet".into(),
                ));
            }
            CryptoState::Off(why) => {
                return Err(SendError::Rejected(format!(
                    "the room is end-to-end encrypted and encryption is unavailable: {why}"
                )));
            }
        };
        let content = outbox::fit_within(content, MAX_SEALED_BYTES)?;
        let path = format!("/rooms/{}/joined_members", segment(room_id));
        let answer: Value = self
            .api
            .request(Method::GET, &path, &[], None, REQUEST_TIMEOUT)
            .await
            .map_err(classify)?;
        let members: Vec<String> = answer
            .get("joined")
            .and_then(Value::as_object)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        let to = Recipients {
            encryption: &encryption,
            members: &members,
        };
        match crypto.encrypt(room_id, to, kind, &content).await {
            Ok(sealed) => Ok(("m.room.encrypted", sealed)),
            Err(CryptoError::Api(e)) => Err(classify(e)),
            Err(e) => Err(SendError::Transient(format!(
                "cannot encrypt for the room: {e}"
            ))),
        }
    }
}
