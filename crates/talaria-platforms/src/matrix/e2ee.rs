//! End-to-end encryption: matrix-sdk-crypto's Olm machine, driven over
//! this adapter's own HTTP client.
//!
//! The machine is sans-I/O: it is fed what `/sync` carries for it
//! (to-device messages, device-list changes, one-time-key counts), hands
//! out the requests it needs sent (key uploads, key queries, key claims,
//! room keys to other devices), and encrypts and decrypts room events.
//! ruma's request types build each request's path and body; they travel
//! through [`Api`], the same client the rest of the adapter uses, so the
//! token handling and errors are the adapter's own.
//!
//! The device's keys (its Olm account, sessions, room keys) live in a
//! SQLite store under the home, one folder per device id: a new access
//! token means a new device and starts a new store, while a restart with
//! the same token finds its keys again.
//!
//! Trust is a policy ([`DeviceTrust`]), never a silent decision: nothing
//! here verifies a device. With `all` (the default, as in Element's usual
//! mode) room keys go to every device of the room's members and messages
//! from unverified devices are read; with `cross-signed` only devices
//! their owner signed get keys, and messages from other devices are
//! refused.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use matrix_sdk_crypto::types::requests::{AnyOutgoingRequest, OutgoingRequest, ToDeviceRequest};
use matrix_sdk_crypto::{
    CollectStrategy, DecryptionSettings, EncryptionSettings, EncryptionSyncChanges, MegolmError,
    OlmMachine, TrustRequirement,
};
use matrix_sdk_sqlite::SqliteCryptoStore;
use reqwest::Method;
use ruma::api::auth_scheme::{AccessToken, SendAccessToken};
use ruma::api::client::keys::get_keys;
use ruma::api::client::sync::sync_events::DeviceLists;
use ruma::api::client::to_device::send_event_to_device;
use ruma::api::path_builder::VersionHistory;
use ruma::api::{
    IncomingResponse, MatrixVersion, OutgoingRequest as RumaRequest, SupportedVersions,
};
use ruma::events::AnyToDeviceEvent;
use ruma::events::room::encryption::RoomEncryptionEventContent;
use ruma::events::room::history_visibility::HistoryVisibility;
use ruma::serde::Raw;
use ruma::{OneTimeKeyAlgorithm, OwnedUserId, RoomId, UInt, UserId};
use serde_json::Value;
use talaria_core::Secret;

use super::api::{Api, ApiError};
use super::config::DeviceTrust;

/// How long one key request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the client-server API's v3 paths start; [`Api`] is rooted there.
const V3: &str = "/_matrix/client/v3";

/// What [`DeviceTrust`] means for sharing room keys.
fn sharing(trust: DeviceTrust) -> CollectStrategy {
    match trust {
        DeviceTrust::All => CollectStrategy::AllDevices,
        DeviceTrust::CrossSigned => CollectStrategy::IdentityBasedStrategy,
    }
}

/// What [`DeviceTrust`] means for reading messages.
fn decryption(trust: DeviceTrust) -> DecryptionSettings {
    DecryptionSettings {
        sender_device_trust_requirement: match trust {
            DeviceTrust::All => TrustRequirement::Untrusted,
            DeviceTrust::CrossSigned => TrustRequirement::CrossSigned,
        },
    }
}

/// Why encryption could not be set up or used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CryptoError {
    /// The homeserver refused or could not be reached.
    #[error("{0}")]
    Api(ApiError),
    /// The device's keys on the homeserver are not the ones this home
    /// holds: the store was lost, or another installation uses the token.
    #[error(
        "the homeserver holds other encryption keys for device {device} than this home's \
         store ({store}) does: the store was deleted or replaced, or the access token is used \
         by another installation. Log in again for a new access token (a new device); the old \
         device can be deleted in any Matrix client"
    )]
    KeysConflict { device: String, store: PathBuf },
    /// A sync section the machine cannot take: retrying it cannot help.
    #[error("{0}")]
    Malformed(String),
    /// Anything else: the store, a malformed id or answer.
    #[error("{0}")]
    Other(String),
}

impl From<ApiError> for CryptoError {
    fn from(e: ApiError) -> CryptoError {
        CryptoError::Api(e)
    }
}

fn malformed(what: &str, e: impl std::fmt::Display) -> CryptoError {
    CryptoError::Malformed(format!("{what}: {e}"))
}

fn other(what: &str, e: impl std::fmt::Display) -> CryptoError {
    CryptoError::Other(format!("{what}: {e}"))
}

/// Why an event was not decrypted.
#[derive(Debug)]
pub(crate) enum Undecrypted {
    /// The room key has not arrived (yet): the event can be tried again
    /// when a key of this session comes.
    MissingKey { session_id: String },
    /// The policy refuses the sender's device, or the event is broken.
    Refused(String),
}

/// What the room's `m.room.encryption` state says and the members the
/// message is for.
pub(crate) struct Recipients<'a> {
    pub encryption: &'a Value,
    pub members: &'a [String],
}

/// The Olm machine and what it needs to talk to the homeserver.
pub(crate) struct Crypto {
    machine: OlmMachine,
    api: Api,
    token: Secret,
    trust: DeviceTrust,
    store: PathBuf,
    /// One round of outgoing requests at a time: two rounds would upload
    /// the same one-time keys twice.
    requests: tokio::sync::Mutex<()>,
    /// One room-key share at a time: sharing decides which devices still
    /// lack the current session's key.
    sharing: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Crypto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Crypto")
            .field("user_id", &self.machine.user_id())
            .field("device_id", &self.machine.device_id())
            .field("trust", &self.trust)
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// The store of `device_id` under `root` (`platforms/matrix/crypto`).
pub(crate) fn store_dir(root: &Path, device_id: &str) -> PathBuf {
    // Device ids are server-chosen text; keep the folder name plain.
    let safe: String = device_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    root.join(safe)
}

impl Crypto {
    /// Opens (or creates) the device's store under `root` and the machine
    /// on it.
    pub(crate) async fn open(
        api: Api,
        token: Secret,
        root: &Path,
        user_id: &str,
        device_id: &str,
        trust: DeviceTrust,
    ) -> Result<Crypto, CryptoError> {
        let user = UserId::parse(user_id).map_err(|e| other("the bot's user id", e))?;
        let device: ruma::OwnedDeviceId = device_id.into();
        let dir = store_dir(root, device_id);
        create_private_dir(&dir)
            .map_err(|e| other(&format!("cannot create {}", dir.display()), e))?;
        let store = SqliteCryptoStore::open(&dir, None)
            .await
            .map_err(|e| other(&format!("cannot open the key store {}", dir.display()), e))?;
        let machine = OlmMachine::with_store(&user, &device, store, None)
            .await
            .map_err(|e| {
                other(
                    &format!("cannot load the device's keys from {}", dir.display()),
                    e,
                )
            })?;
        Ok(Crypto {
            machine,
            api,
            token,
            trust,
            store: dir,
            requests: tokio::sync::Mutex::new(()),
            sharing: tokio::sync::Mutex::new(()),
        })
    }

    /// The device's public identity key (ed25519), as other clients show it.
    pub(crate) fn fingerprint(&self) -> String {
        self.machine.identity_keys().ed25519.to_base64()
    }

    /// Checks that the keys the homeserver publishes for this device, if
    /// any, are this store's: uploading over them would be refused, and
    /// every other client would distrust the device.
    pub(crate) async fn check_published_keys(&self) -> Result<(), CryptoError> {
        let user = self.machine.user_id().to_string();
        let device = self.machine.device_id().to_string();
        let body = serde_json::json!({ "device_keys": { &user: [&device] } });
        let answer: Value = self
            .api
            .request(
                Method::POST,
                "/keys/query",
                &[],
                Some(&body),
                REQUEST_TIMEOUT,
            )
            .await?;
        let published = answer
            .get("device_keys")
            .and_then(|d| d.get(&user))
            .and_then(|d| d.get(&device))
            .and_then(|d| d.get("keys"))
            .and_then(|k| k.get(format!("ed25519:{device}")))
            .and_then(Value::as_str);
        match published {
            Some(key) if key != self.fingerprint() => Err(CryptoError::KeysConflict {
                device,
                store: self.store.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Feeds the machine what a sync batch carries for it; returns the
    /// sessions whose room keys arrived.
    pub(crate) async fn receive(&self, sync: &Value) -> Result<BTreeSet<String>, CryptoError> {
        let to_device: Vec<Raw<AnyToDeviceEvent>> =
            section(sync, "/to_device/events")?.unwrap_or_default();
        let lists: DeviceLists = section(sync, "/device_lists")?.unwrap_or_default();
        let counts: BTreeMap<OneTimeKeyAlgorithm, UInt> =
            section(sync, "/device_one_time_keys_count")?.unwrap_or_default();
        let fallback: Option<Vec<OneTimeKeyAlgorithm>> =
            section(sync, "/device_unused_fallback_key_types")?;
        let changes = EncryptionSyncChanges {
            to_device_events: to_device,
            changed_devices: &lists,
            one_time_keys_counts: &counts,
            unused_fallback_keys: fallback.as_deref(),
            next_batch_token: sync
                .get("next_batch")
                .and_then(Value::as_str)
                .map(str::to_owned),
        };
        let (_, keys) = self
            .machine
            .receive_sync_changes(changes, &decryption(self.trust))
            .await
            .map_err(|e| other("cannot take the sync's encryption changes", e))?;
        Ok(keys.into_iter().map(|k| k.session_id).collect())
    }

    /// Sends what the machine has queued: key uploads and queries, and
    /// to-device messages. A failed request stays queued for the next
    /// round.
    pub(crate) async fn flush(&self) {
        let _round = self.requests.lock().await;
        let requests = match self.machine.outgoing_requests().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("cannot read the encryption requests to send: {e}");
                return;
            }
        };
        for request in requests {
            if let Err(e) = self.send_request(&request).await {
                tracing::warn!("an encryption request failed (it is tried again later): {e}");
            }
        }
    }

    async fn send_request(&self, request: &OutgoingRequest) -> Result<(), CryptoError> {
        let id = request.request_id();
        let marked = match request.request() {
            AnyOutgoingRequest::KeysUpload(r) => {
                let answer = self.call(r.clone()).await?;
                self.machine.mark_request_as_sent(id, &answer).await
            }
            AnyOutgoingRequest::KeysQuery(r) => {
                let mut query = get_keys::v3::Request::new();
                query.device_keys = r.device_keys.clone();
                query.timeout = r.timeout;
                let answer = self.call(query).await?;
                self.machine.mark_request_as_sent(id, &answer).await
            }
            AnyOutgoingRequest::KeysClaim(r) => {
                let answer = self.call(r.clone()).await?;
                self.machine.mark_request_as_sent(id, &answer).await
            }
            AnyOutgoingRequest::ToDeviceRequest(r) => {
                let answer = self.call(to_device(r)).await?;
                self.machine.mark_request_as_sent(id, &answer).await
            }
            AnyOutgoingRequest::SignatureUpload(r) => {
                let answer = self.call(r.clone()).await?;
                self.machine.mark_request_as_sent(id, &answer).await
            }
            AnyOutgoingRequest::RoomMessage(_) => {
                // In-room verification, which the bot never starts or
                // accepts: nothing to send.
                return Ok(());
            }
        };
        marked.map_err(|e| other("cannot record an answered encryption request", e))
    }

    /// Encrypts `content` (an event of type `kind`) for the room: first
    /// the members' device keys and Olm sessions where missing, then the
    /// room key to every device the policy allows. Returns the
    /// `m.room.encrypted` content to send.
    pub(crate) async fn encrypt(
        &self,
        room: &str,
        to: Recipients<'_>,
        kind: &str,
        content: &Value,
    ) -> Result<Value, CryptoError> {
        let room_id = RoomId::parse(room).map_err(|e| other("the room id", e))?;
        let members: Vec<OwnedUserId> = to
            .members
            .iter()
            .filter_map(|m| UserId::parse(m).ok())
            .collect();
        let settings = EncryptionSettings::new(
            serde_json::from_value::<RoomEncryptionEventContent>(to.encryption.clone())
                .map_err(|e| other("the room's m.room.encryption state", e))?,
            HistoryVisibility::Shared,
            sharing(self.trust),
        );
        let _share = self.sharing.lock().await;
        self.machine
            .update_tracked_users(members.iter().map(AsRef::as_ref))
            .await
            .map_err(|e| other("cannot track the room's members", e))?;
        // Newly tracked members' devices are queried here, before the
        // sessions to them are claimed.
        self.flush().await;
        if let Some((id, claim)) = self
            .machine
            .get_missing_sessions(members.iter().map(AsRef::as_ref))
            .await
            .map_err(|e| other("cannot tell which devices lack a session", e))?
        {
            let answer = self.call(claim).await?;
            self.machine
                .mark_request_as_sent(&id, &answer)
                .await
                .map_err(|e| other("cannot start sessions with the claimed keys", e))?;
        }
        let shares = self
            .machine
            .share_room_key(&room_id, members.iter().map(AsRef::as_ref), settings)
            .await
            .map_err(|e| other("cannot share the room key", e))?;
        for share in shares {
            let answer = self.call(to_device(&share)).await?;
            self.machine
                .mark_request_as_sent(&share.txn_id, &answer)
                .await
                .map_err(|e| other("cannot record a shared room key", e))?;
        }
        let raw = serde_json::value::to_raw_value(content)
            .map(Raw::from_json)
            .map_err(|e| other("the message content", e))?;
        let encrypted = self
            .machine
            .encrypt_room_event_raw(&room_id, kind, &raw)
            .await
            .map_err(|e| other("cannot encrypt the message", e))?;
        serde_json::from_str(encrypted.content.json().get())
            .map_err(|e| other("the encrypted content", e))
    }

    /// Decrypts an `m.room.encrypted` event of `room` into the event it
    /// carries (type, content, and the envelope's ids).
    pub(crate) async fn decrypt(&self, room: &str, event: &Value) -> Result<Value, Undecrypted> {
        let room_id =
            RoomId::parse(room).map_err(|e| Undecrypted::Refused(format!("the room id: {e}")))?;
        let raw = serde_json::value::to_raw_value(event)
            .map(Raw::from_json)
            .map_err(|e| Undecrypted::Refused(e.to_string()))?;
        match self
            .machine
            .decrypt_room_event(&raw, &room_id, &decryption(self.trust))
            .await
        {
            Ok(decrypted) => {
                let mut plain: Value = serde_json::from_str(decrypted.event.json().get())
                    .map_err(|e| Undecrypted::Refused(e.to_string()))?;
                // Relations travel in the clear, beside the ciphertext,
                // so that servers can thread and aggregate.
                if let (Some(relation), Some(content)) = (
                    event.pointer("/content/m.relates_to"),
                    plain.get_mut("content").and_then(Value::as_object_mut),
                ) && !content.contains_key("m.relates_to")
                {
                    content.insert("m.relates_to".to_owned(), relation.clone());
                }
                // Trust is the policy's (`device_trust`); what the
                // sender's device was is only recorded.
                tracing::debug!(
                    room,
                    sender = %decrypted.encryption_info.sender,
                    device = ?decrypted.encryption_info.sender_device,
                    state = ?decrypted.encryption_info.verification_state,
                    "decrypted a message"
                );
                Ok(plain)
            }
            Err(MegolmError::MissingRoomKey(withheld)) => match withheld {
                Some(code) => Err(Undecrypted::Refused(format!(
                    "the sender withheld the room key ({code})"
                ))),
                None => Err(Undecrypted::MissingKey {
                    session_id: event
                        .pointer("/content/session_id")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                }),
            },
            Err(MegolmError::SenderIdentityNotTrusted(level)) => {
                Err(Undecrypted::Refused(format!(
                    "the sender's device is not trusted under device_trust: cross-signed ({level})"
                )))
            }
            Err(e) => Err(Undecrypted::Refused(e.to_string())),
        }
    }

    /// Sends one ruma request through the adapter's client and reads its
    /// answer back into ruma's response type.
    async fn call<R>(&self, request: R) -> Result<R::IncomingResponse, CryptoError>
    where
        R: RumaRequest<Authentication = AccessToken, PathBuilder = VersionHistory>,
    {
        let versions = SupportedVersions {
            versions: [MatrixVersion::V1_1].into(),
            features: Default::default(),
        };
        let built: http::Request<Vec<u8>> = request
            .try_into_http_request(
                "",
                SendAccessToken::IfRequired(self.token.expose()),
                Cow::Owned(versions),
            )
            .map_err(|e| other("cannot build an encryption request", e))?;
        let uri = built.uri();
        let path = uri
            .path()
            .strip_prefix(V3)
            .ok_or_else(|| other("an encryption request outside the v3 API", uri.path()))?;
        let path = match uri.query() {
            Some(q) => format!("{path}?{q}"),
            None => path.to_owned(),
        };
        let body: Option<Value> = if built.body().is_empty() {
            None
        } else {
            Some(
                serde_json::from_slice(built.body())
                    .map_err(|e| other("an encryption request's body", e))?,
            )
        };
        let answer: Value = self
            .api
            .request(
                built.method().clone(),
                &path,
                &[],
                body.as_ref(),
                REQUEST_TIMEOUT,
            )
            .await?;
        let bytes = serde_json::to_vec(&answer).map_err(|e| other("an answer", e))?;
        let response = http::Response::builder()
            .status(200)
            .body(bytes)
            .map_err(|e| other("an answer", e))?;
        R::IncomingResponse::try_from_http_response(response)
            .map_err(|e| other(&format!("an unexpected answer to {path}"), e))
    }
}

/// The sync's section at `pointer`, read into `T`; `None` when absent.
fn section<T: serde::de::DeserializeOwned>(
    sync: &Value,
    pointer: &str,
) -> Result<Option<T>, CryptoError> {
    sync.pointer(pointer)
        .map(|v| T::deserialize(v))
        .transpose()
        .map_err(|e| malformed(&format!("a malformed {pointer} section"), e))
}

fn to_device(r: &ToDeviceRequest) -> send_event_to_device::v3::Request {
    send_event_to_device::v3::Request::new_raw(
        r.event_type.clone(),
        r.txn_id.clone(),
        r.messages.clone(),
    )
}

fn create_private_dir(path: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_folders_are_plain_names_under_the_root() {
        let root = Path::new("/h/platforms/matrix/crypto");
        assert_eq!(store_dir(root, "ABCDEF"), root.join("ABCDEF"));
        assert_eq!(store_dir(root, "../x y"), root.join("___x_y"));
    }
}
