//! Stored responses: kept in the gateway's cursor store under a namespace
//! of their own, so they survive a restart and every node of a shared
//! store serves them, without a schema of their own.

use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use talaria_store::CursorStore;

use crate::error::ApiError;

/// The cursor namespace responses live under.
const NAMESPACE: &str = "api_responses";

/// Largest stored record, in bytes. Tool items are already bounded (see
/// `object`); this catches an answer of absurd size, which is then
/// answered but not kept.
pub(crate) const MAX_RECORD_BYTES: usize = 4 * 1024 * 1024;

/// One stored response: the object as answered, and where its
/// conversation is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredResponse {
    /// The session holding the conversation up to this response.
    pub(crate) session_id: String,
    /// Rows the session held, replaced ones included, right after this
    /// response: while it still holds exactly these, no turn has run on it
    /// since and it can simply be continued.
    pub(crate) rows: u64,
    /// Active rows the session held right after this response: its
    /// conversation is the first `active` rows of the transcript as long
    /// as no compression rewrote it since.
    pub(crate) active: u64,
    /// The `response` object.
    pub(crate) response: Value,
}

/// Where responses are kept; without a store (a server not run by the
/// gateway) none is, and every id is unknown.
#[derive(Default)]
pub(crate) struct ResponseStore {
    store: OnceLock<Arc<dyn CursorStore>>,
}

/// Whether `id` can be a response id of this server: `resp_` and a safe
/// path component. Anything else is unknown without a store read.
fn plausible(id: &str) -> bool {
    id.starts_with("resp_") && talaria_core::ids::validate_path_component(id).is_ok()
}

impl ResponseStore {
    /// Keeps responses in `store` from now on; a second call changes
    /// nothing.
    pub(crate) fn attach(&self, store: Arc<dyn CursorStore>) {
        let _ = self.store.set(store);
    }

    /// The stored response `id`, if there is one.
    ///
    /// # Errors
    /// 500 when the store cannot be read.
    pub(crate) async fn get(&self, id: &str) -> Result<Option<StoredResponse>, ApiError> {
        let Some(store) = self.store.get() else {
            return Ok(None);
        };
        if !plausible(id) {
            return Ok(None);
        }
        let raw = store.cursor(NAMESPACE, id).await.map_err(|e| {
            tracing::warn!(error = %e, "cannot read a stored response");
            ApiError::internal(format!("Cannot read the stored response: {e}"))
        })?;
        Ok(raw.and_then(|raw| match serde_json::from_str(&raw) {
            Ok(record) => Some(record),
            Err(e) => {
                tracing::warn!(response = %id, error = %e, "a stored response is unreadable");
                None
            }
        }))
    }

    /// Keeps `record` under `id`. A failure is logged, not returned: the
    /// answer is already made, and a response that cannot be kept is one
    /// that later reads as unknown.
    pub(crate) async fn put(&self, id: &str, record: &StoredResponse) {
        let Some(store) = self.store.get() else {
            return;
        };
        let raw = match serde_json::to_string(record) {
            Ok(raw) => raw,
            Err(e) => {
                tracing::warn!(response = %id, error = %e, "cannot encode a response");
                return;
            }
        };
        if raw.len() > MAX_RECORD_BYTES {
            tracing::warn!(response = %id, bytes = raw.len(), "a response is too large to keep");
            return;
        }
        if let Err(e) = store.set_cursor(NAMESPACE, id, &raw).await {
            tracing::warn!(response = %id, error = %e, "cannot store a response");
        }
    }

    /// Forgets response `id`; whether it was there.
    ///
    /// # Errors
    /// 500 when the store cannot be written.
    pub(crate) async fn delete(&self, id: &str) -> Result<bool, ApiError> {
        let Some(store) = self.store.get() else {
            return Ok(false);
        };
        if !plausible(id) {
            return Ok(false);
        }
        store.delete_cursor(NAMESPACE, id).await.map_err(|e| {
            tracing::warn!(error = %e, "cannot delete a stored response");
            ApiError::internal(format!("Cannot delete the stored response: {e}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_safe_response_ids_reach_the_store() {
        assert!(plausible("resp_0123abcd"));
        for bad in ["", "resp", "msg_1", "resp_/../x", "resp_a b", "resp_\n"] {
            assert!(!plausible(bad), "{bad:?}");
        }
    }
}
