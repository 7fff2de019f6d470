//! The notification routes on the shared listener, and the journal that
//! keeps what they accepted until it is handed over.
//!
//! `/msgraph/webhook` and `/msgraph/lifecycle` (POST; GET too, for the
//! handshake) run these steps in order:
//!
//! 1. a `validationToken` query parameter → 200 `text/plain` with the
//!    token URL-decoded (Graph's check of the URL while it creates a
//!    subscription); nothing else is read
//! 2. body over `max_body_bytes` → 413
//! 3. not `{"value": [...]}` → 400
//! 4. each item's `clientState` compared, in constant time, with ours;
//!    a mismatch is dropped (logged, never acted on)
//! 5. change items: resource outside `accepted_resources` or of a shape
//!    not read → dropped; a notification id seen before → a repeat;
//!    the rest written to the journal in the store, then 202. The
//!    resource is fetched after the answer, by the adapter's worker; a
//!    gateway that dies after the 202 finds the item in the journal at
//!    its next start. A journal that cannot be written → 503, and Graph
//!    delivers again.
//!    Lifecycle items (either route) are queued for the adapter's
//!    subscription keeper.
//! 6. 202 when any item was taken or a repeat; 403 when every item failed
//!    its `clientState`; 400 otherwise.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use talaria_core::Secret;
use talaria_store::CursorStore;
use tokio::sync::Notify;

use super::PLATFORM;
use super::mapping::Item;
use crate::ingress::{InboxSlot, json_refusal, read_body};
use crate::seen::Seen;

/// Where Graph posts change notifications (behind `public_url`).
pub const WEBHOOK_PATH: &str = "/msgraph/webhook";

/// Where Graph posts lifecycle notifications.
pub const LIFECYCLE_PATH: &str = "/msgraph/lifecycle";

/// The journal's name in the cursor store.
const JOURNAL: &str = "pending";

/// The longest validation token echoed.
const MAX_TOKEN: usize = 8 * 1024;

/// A lifecycle event for one of our subscriptions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Lifecycle {
    pub subscription: String,
    pub event: String,
}

/// One accepted change, waiting to be fetched and handed over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Pending {
    /// The notification's key (its id, or a digest of the item).
    pub key: String,
    /// The item's resource, as [`Item::resource`] writes it.
    pub resource: String,
}

/// The accepted changes not yet handed over, kept in the store so a
/// restart finds them (see the module docs). Oldest first.
pub(crate) struct Journal {
    store: Arc<dyn CursorStore>,
    items: tokio::sync::Mutex<Option<Vec<Pending>>>,
    cap: usize,
    /// Woken when an item is added.
    pub wake: Notify,
}

impl Journal {
    pub(crate) fn new(store: Arc<dyn CursorStore>, cap: usize) -> Journal {
        Journal {
            store,
            items: tokio::sync::Mutex::new(None),
            cap,
            wake: Notify::new(),
        }
    }

    async fn loaded<'a>(
        &self,
        guard: &'a mut Option<Vec<Pending>>,
    ) -> Result<&'a mut Vec<Pending>, String> {
        if guard.is_none() {
            let saved = self
                .store
                .cursor(PLATFORM, JOURNAL)
                .await
                .map_err(|e| format!("cannot read the journal: {e}"))?;
            let items = match saved {
                Some(text) => serde_json::from_str(&text).unwrap_or_else(|e| {
                    tracing::warn!(
                        "the Microsoft Graph journal is unreadable, starting empty: {e}"
                    );
                    Vec::new()
                }),
                None => Vec::new(),
            };
            *guard = Some(items);
        }
        guard
            .as_mut()
            .ok_or_else(|| "the journal is not loaded".to_owned())
    }

    async fn save(&self, items: &[Pending]) -> Result<(), String> {
        let text = serde_json::to_string(items).map_err(|e| e.to_string())?;
        self.store
            .set_cursor(PLATFORM, JOURNAL, &text)
            .await
            .map_err(|e| format!("cannot write the journal: {e}"))
    }

    /// Appends `new` (those whose key is not there yet) and saves.
    pub(crate) async fn add(&self, new: Vec<Pending>) -> Result<(), String> {
        if new.is_empty() {
            return Ok(());
        }
        let mut guard = self.items.lock().await;
        let items = self.loaded(&mut guard).await?;
        let before = items.len();
        for p in new {
            if !items.iter().any(|i| i.key == p.key) {
                items.push(p);
            }
        }
        if items.len() > self.cap {
            items.truncate(before);
            return Err("the journal is full".to_owned());
        }
        let snapshot = items.clone();
        if let Err(e) = self.save(&snapshot).await {
            items.truncate(before);
            return Err(e);
        }
        drop(guard);
        self.wake.notify_one();
        Ok(())
    }

    /// The oldest item.
    pub(crate) async fn first(&self) -> Result<Option<Pending>, String> {
        let mut guard = self.items.lock().await;
        Ok(self.loaded(&mut guard).await?.first().cloned())
    }

    /// Forgets the item `key` and saves.
    pub(crate) async fn remove(&self, key: &str) -> Result<(), String> {
        let mut guard = self.items.lock().await;
        let items = self.loaded(&mut guard).await?;
        items.retain(|i| i.key != key);
        let snapshot = items.clone();
        self.save(&snapshot).await
    }

    /// How many items wait.
    pub(crate) async fn len(&self) -> usize {
        let mut guard = self.items.lock().await;
        self.loaded(&mut guard).await.map_or(0, |i| i.len())
    }
}

/// What the handlers share with the adapter.
pub(crate) struct Hook {
    pub client_state: Secret,
    pub accepted: Vec<String>,
    pub max_body_bytes: usize,
    pub slot: InboxSlot,
    pub journal: Arc<Journal>,
    /// Notification keys already taken.
    pub notes: Mutex<Seen>,
    /// Lifecycle events waiting for the subscription keeper.
    pub lifecycle: Mutex<VecDeque<Lifecycle>>,
    pub lifecycle_wake: Notify,
}

pub(crate) fn router(hook: Arc<Hook>) -> Router {
    Router::new()
        .route(WEBHOOK_PATH, post(changes).get(changes_get))
        .route(LIFECYCLE_PATH, post(lifecycle).get(lifecycle_get))
        .with_state(hook)
}

/// Whether `a` and `b` are the same secret, in time that does not depend
/// on where they differ (both are hashed first, so their lengths do not
/// show either).
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    let (x, y) = (Sha256::digest(a.as_bytes()), Sha256::digest(b.as_bytes()));
    x.iter()
        .zip(y.iter())
        .fold(0u8, |acc, (p, q)| acc | (p ^ q))
        == 0
}

/// Whether `resource` falls under one of `accepted` (prefixes, a trailing
/// `*` allowed, case ignored); everything when the list is empty.
pub(crate) fn accepted(accepted: &[String], resource: &str) -> bool {
    let r = resource.trim_start_matches('/').to_ascii_lowercase();
    accepted.is_empty()
        || accepted.iter().any(|a| {
            let a = a.trim().trim_start_matches('/').trim_end_matches('*');
            r.starts_with(&a.to_ascii_lowercase())
        })
}

/// The `validationToken` of a handshake, URL-decoded.
fn validation_token(query: Option<&str>) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes())
        .find(|(k, _)| k == "validationToken")
        .map(|(_, v)| v.into_owned())
}

fn handshake(token: String) -> Response {
    if token.len() > MAX_TOKEN {
        return json_refusal(StatusCode::BAD_REQUEST, "the validation token is too long");
    }
    tracing::info!("Microsoft Graph validated the notification URL");
    let mut r = (StatusCode::OK, token).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

async fn changes_get(RawQuery(query): RawQuery) -> Response {
    match validation_token(query.as_deref()) {
        Some(t) => handshake(t),
        None => json_refusal(StatusCode::METHOD_NOT_ALLOWED, "POST notifications here"),
    }
}

async fn lifecycle_get(q: RawQuery) -> Response {
    changes_get(q).await
}

/// The body's items, or the refusal to answer with.
async fn items(hook: &Hook, headers: &HeaderMap, body: Body) -> Result<Vec<Value>, Response> {
    let body = read_body(body, headers, hook.max_body_bytes)
        .await
        .map_err(|e| {
            tracing::info!("Microsoft Graph notification body refused: {e}");
            json_refusal(e.status(), &e.to_string())
        })?;
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    match parsed["value"].as_array() {
        Some(items) => Ok(items.clone()),
        None => Err(json_refusal(
            StatusCode::BAD_REQUEST,
            "the body is not a Graph notification collection",
        )),
    }
}

/// How a batch went, item by item.
#[derive(Debug, Default)]
struct Tally {
    taken: usize,
    repeats: usize,
    forged: usize,
    other: usize,
}

impl Tally {
    fn answer(&self) -> Response {
        let counts = json!({"taken": self.taken, "repeats": self.repeats});
        if self.taken + self.repeats > 0 {
            (StatusCode::ACCEPTED, axum::Json(counts)).into_response()
        } else if self.forged > 0 && self.other == 0 {
            json_refusal(StatusCode::FORBIDDEN, "clientState does not match")
        } else {
            json_refusal(
                StatusCode::BAD_REQUEST,
                "no notification in the body was usable",
            )
        }
    }
}

fn queue_lifecycle(hook: &Hook, item: &Value, tally: &mut Tally) {
    let (Some(subscription), Some(event)) = (
        item["subscriptionId"].as_str(),
        item["lifecycleEvent"].as_str(),
    ) else {
        tally.other += 1;
        return;
    };
    tracing::info!(%subscription, %event, "Microsoft Graph lifecycle notification");
    hook.lifecycle
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push_back(Lifecycle {
            subscription: subscription.to_owned(),
            event: event.to_owned(),
        });
    hook.lifecycle_wake.notify_one();
    tally.taken += 1;
}

fn checked(hook: &Hook, item: &Value, tally: &mut Tally) -> bool {
    let state = item["clientState"].as_str().unwrap_or("");
    if same_secret(state, hook.client_state.expose()) {
        true
    } else {
        tally.forged += 1;
        false
    }
}

async fn changes(
    State(hook): State<Arc<Hook>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Some(token) = validation_token(query.as_deref()) {
        return handshake(token);
    }
    let items = match items(&hook, &headers, body).await {
        Ok(i) => i,
        Err(r) => return r,
    };
    let mut tally = Tally::default();
    let mut new: Vec<Pending> = Vec::new();
    for item in &items {
        if !checked(&hook, item, &mut tally) {
            continue;
        }
        if item.get("lifecycleEvent").is_some() {
            queue_lifecycle(&hook, item, &mut tally);
            continue;
        }
        let resource = item["resource"].as_str().unwrap_or("");
        if !accepted(&hook.accepted, resource) {
            tracing::info!(%resource, "a Graph notification for a resource not accepted");
            tally.other += 1;
            continue;
        }
        let Some(parsed) = Item::parse(resource) else {
            tracing::info!(%resource, "a Graph notification for a resource this adapter does not read");
            tally.other += 1;
            continue;
        };
        let key = match item["id"].as_str().filter(|s| !s.is_empty()) {
            Some(id) => format!("id:{id}"),
            None => {
                let digest = Sha256::digest(item.to_string().as_bytes());
                let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
                format!("sha:{hex}")
            }
        };
        let fresh = {
            let notes = hook.notes.lock().unwrap_or_else(|p| p.into_inner());
            !notes.contains(&key)
        } && !new.iter().any(|p| p.key == key);
        if !fresh {
            tally.repeats += 1;
            continue;
        }
        new.push(Pending {
            key,
            resource: parsed.resource(),
        });
    }
    if tally.forged > 0 {
        tracing::warn!(
            count = tally.forged,
            "Graph notifications with a wrong clientState dropped"
        );
    }
    let count = new.len();
    let keys: Vec<String> = new.iter().map(|p| p.key.clone()).collect();
    if let Err(e) = hook.journal.add(new).await {
        tracing::warn!("cannot keep Graph notifications ({e}); Graph delivers them again");
        return json_refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "cannot take notifications right now; retry later",
        );
    }
    {
        let mut notes = hook.notes.lock().unwrap_or_else(|p| p.into_inner());
        for k in &keys {
            notes.first(k);
        }
    }
    tally.taken += count;
    tally.answer()
}

async fn lifecycle(
    State(hook): State<Arc<Hook>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Some(token) = validation_token(query.as_deref()) {
        return handshake(token);
    }
    let items = match items(&hook, &headers, body).await {
        Ok(i) => i,
        Err(r) => return r,
    };
    let mut tally = Tally::default();
    for item in &items {
        if checked(&hook, item, &mut tally) {
            queue_lifecycle(&hook, item, &mut tally);
        }
    }
    tally.answer()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "abcd"));
        assert!(!same_secret("", "abc"));
    }

    #[test]
    fn accepted_resources_are_prefixes() {
        let list = vec!["chats*".to_owned(), "/Users/u1/".to_owned()];
        assert!(accepted(&list, "chats('19:a')/messages('1')"));
        assert!(accepted(&list, "Users/u1/Messages/m"));
        assert!(!accepted(&list, "teams('t')/channels('c')/messages('1')"));
        assert!(accepted(&[], "anything"));
    }

    #[test]
    fn validation_tokens_are_url_decoded() {
        assert_eq!(
            validation_token(Some(
                "validationToken=Validation%3a+Testing+client+application"
            )),
            Some("Validation: Testing client application".to_owned())
        );
        assert_eq!(validation_token(Some("other=1")), None);
        assert_eq!(validation_token(None), None);
    }
}
