//! A fake Home Assistant REST API on 127.0.0.1, for adapter, tool and
//! end-to-end tests.
//!
//! [`FakeHomeAssistant`] answers the parts of `/api` Talaria uses, over
//! real HTTP, each requiring `Authorization: Bearer <token>` (else 401 with
//! Home Assistant's plain `401: Unauthorized`):
//!
//! - `GET /api/` → `{"message": "API running."}`;
//! - `GET /api/states` → every entity's state object; `GET
//!   /api/states/<entity_id>` → one, or 404 `{"message": "Entity not
//!   found."}`;
//! - `GET /api/services` → `[{"domain", "services": {name: {name,
//!   description, fields}}}]`;
//! - `POST /api/services/<domain>/<service>` with a JSON object → the
//!   states that changed (as Home Assistant answers), 400 `{"message":
//!   "Service <d>.<s> not found."}` for an unknown one. `turn_on`,
//!   `turn_off` and `toggle` change the state of the entities named in
//!   `entity_id`; every other call changes nothing. Every call is
//!   recorded, `persistent_notification.create` also as a
//!   [`Notification`].
//!
//! The house: `light.kitchen` (on), `light.living_room` (off),
//! `switch.coffee_maker` (off), `lock.front_door` (locked),
//! `sensor.outside_temperature` (12.5 °C). Services: `light.turn_on`,
//! `light.turn_off`, `light.toggle`, `switch.turn_on`, `switch.turn_off`,
//! `lock.lock`, `lock.unlock`, `persistent_notification.create`,
//! `persistent_notification.dismiss`.
//!
//! Tests break it with [`FakeHomeAssistant::fail_next`] (the next requests
//! to a path get a status of the test's choosing).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::Response;
use serde_json::{Value, json};

use crate::fake::{Core, Faults, bind, started};
use crate::json_response;

/// One service call as the fake received it.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceCall {
    /// The service's domain (`light`, `notify`, ...).
    pub domain: String,
    /// The service name within the domain (`turn_on`, ...).
    pub service: String,
    /// The JSON body (the service data, with `entity_id` when given).
    pub data: Value,
}

/// One `persistent_notification.create` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The notification's title, when given.
    pub title: Option<String>,
    /// The notification's text.
    pub message: String,
    /// The id that replaces an earlier notification with the same id, when given.
    pub notification_id: Option<String>,
}

#[derive(Default)]
struct Book {
    /// entity_id → (state, attributes).
    states: BTreeMap<String, (String, Value)>,
    calls: Vec<ServiceCall>,
    notifications: Vec<Notification>,
    /// (path prefix, status to answer with), in order.
    failures: Faults<(String, u16)>,
    /// Requests refused for their bearer.
    unauthorized: usize,
}

struct Shared {
    token: String,
    addr: SocketAddr,
    core: Core<Book>,
}

/// A fake Home Assistant (see the module docs). Stops when dropped.
pub struct FakeHomeAssistant {
    shared: Arc<Shared>,
}

impl Drop for FakeHomeAssistant {
    fn drop(&mut self) {
        self.shared.core.stop();
    }
}

/// A service: its name, description and field names.
type ServiceSpec = (&'static str, &'static str, Vec<&'static str>);

/// The services offered, by domain, with their fields.
fn services() -> Vec<(&'static str, Vec<ServiceSpec>)> {
    vec![
        (
            "light",
            vec![
                (
                    "turn_on",
                    "Turns on one or more lights.",
                    vec!["brightness_pct", "color_name"],
                ),
                (
                    "turn_off",
                    "Turns off one or more lights.",
                    vec!["transition"],
                ),
                ("toggle", "Toggles one or more lights.", vec![]),
            ],
        ),
        (
            "switch",
            vec![
                ("turn_on", "Turns a switch on.", vec![]),
                ("turn_off", "Turns a switch off.", vec![]),
            ],
        ),
        (
            "lock",
            vec![
                ("lock", "Locks a lock.", vec!["code"]),
                ("unlock", "Unlocks a lock.", vec!["code"]),
            ],
        ),
        (
            "persistent_notification",
            vec![
                (
                    "create",
                    "Shows a notification.",
                    vec!["message", "title", "notification_id"],
                ),
                (
                    "dismiss",
                    "Removes a notification.",
                    vec!["notification_id"],
                ),
            ],
        ),
    ]
}

impl FakeHomeAssistant {
    /// Starts the server on 127.0.0.1 with an ephemeral port, accepting
    /// `token`.
    ///
    /// # Panics
    /// When no local port can be bound (a broken test environment).
    pub async fn start(token: &str) -> FakeHomeAssistant {
        started("the fake Home Assistant", Self::try_start(token))
    }

    /// Like [`Self::start`], returning the error instead.
    pub fn try_start(token: &str) -> std::io::Result<FakeHomeAssistant> {
        let (listener, addr) = bind()?;
        let mut book = Book::default();
        for (id, state, attributes) in [
            (
                "light.kitchen",
                "on",
                json!({"friendly_name": "Kitchen Light", "brightness": 200}),
            ),
            (
                "light.living_room",
                "off",
                json!({"friendly_name": "Living Room Light"}),
            ),
            (
                "switch.coffee_maker",
                "off",
                json!({"friendly_name": "Coffee Maker"}),
            ),
            (
                "lock.front_door",
                "locked",
                json!({"friendly_name": "Front Door"}),
            ),
            (
                "sensor.outside_temperature",
                "12.5",
                json!({"friendly_name": "Outside Temperature", "unit_of_measurement": "°C"}),
            ),
        ] {
            book.states
                .insert(id.to_owned(), (state.to_owned(), attributes));
        }
        let shared = Arc::new(Shared {
            token: token.to_owned(),
            addr,
            core: Core::new(book),
        });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        shared.core.serve("fake-homeassistant", listener, app)?;
        Ok(FakeHomeAssistant { shared })
    }

    /// `http://127.0.0.1:PORT`: the `HASS_URL`.
    pub fn url(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    /// The accepted token.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// Every service call so far, oldest first (notifications included).
    pub fn calls(&self) -> Vec<ServiceCall> {
        self.shared.core.read().calls.clone()
    }

    /// Every notification created so far, oldest first.
    pub fn notifications(&self) -> Vec<Notification> {
        self.shared.core.read().notifications.clone()
    }

    /// How many requests were refused for their bearer.
    pub fn unauthorized(&self) -> usize {
        self.shared.core.read().unauthorized
    }

    /// An entity's current state.
    pub fn state(&self, entity_id: &str) -> Option<String> {
        self.shared
            .core
            .read()
            .states
            .get(entity_id)
            .map(|(s, _)| s.clone())
    }

    /// The next requests whose path starts with `path_prefix` (`/api/services/
    /// persistent_notification`) are answered with these statuses, one
    /// each, without effect.
    pub fn fail_next(&self, path_prefix: &str, statuses: &[u16]) {
        let mut book = self.shared.core.change();
        for status in statuses {
            book.failures.push((path_prefix.to_owned(), *status));
        }
    }

    /// Waits until `n` notifications exist, and returns them all.
    ///
    /// # Panics
    /// When they do not come within `timeout`.
    pub async fn wait_for_notifications(&self, n: usize, timeout: Duration) -> Vec<Notification> {
        self.shared
            .core
            .wait_len("notifications", n, timeout, |b| &b.notifications)
            .await
    }
}

fn state_object(id: &str, state: &str, attributes: &Value) -> Value {
    json!({
        "entity_id": id,
        "state": state,
        "attributes": attributes,
        "last_changed": "2026-01-01T00:00:00+00:00",
        "last_updated": "2026-01-01T00:00:00+00:00",
        "context": {"id": "01J0000000000000000000000", "parent_id": null, "user_id": null},
    })
}

fn message(status: u16, text: &str) -> Response {
    json_response(status, &json!({"message": text}))
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if bearer != Some(shared.token.as_str()) {
        shared.core.change().unauthorized += 1;
        let mut r = Response::new(Body::from("401: Unauthorized"));
        *r.status_mut() = StatusCode::UNAUTHORIZED;
        return r;
    }
    let path = uri.path().to_owned();
    let failure = shared
        .core
        .change()
        .failures
        .take_first(|(prefix, _)| path.starts_with(prefix.as_str()));
    if let Some((_, status)) = failure {
        return message(status, "scripted failure");
    }
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (method.clone(), segments.as_slice()) {
        (Method::GET, ["api", ""] | ["api"]) => message(200, "API running."),
        (Method::GET, ["api", "states"]) => {
            let book = shared.core.read();
            let all: Vec<Value> = book
                .states
                .iter()
                .map(|(id, (s, a))| state_object(id, s, a))
                .collect();
            json_response(200, &Value::Array(all))
        }
        (Method::GET, ["api", "states", id]) => match shared.core.read().states.get(*id) {
            Some((s, a)) => json_response(200, &state_object(id, s, a)),
            None => message(404, "Entity not found."),
        },
        (Method::GET, ["api", "services"]) => {
            let list: Vec<Value> = services()
                .into_iter()
                .map(|(domain, list)| {
                    let mut map = serde_json::Map::new();
                    for (name, description, fields) in list {
                        let fields: serde_json::Map<String, Value> = fields
                            .into_iter()
                            .map(|f| (f.to_owned(), json!({"name": f})))
                            .collect();
                        map.insert(
                            name.to_owned(),
                            json!({"name": name, "description": description, "fields": fields}),
                        );
                    }
                    json!({"domain": domain, "services": map})
                })
                .collect();
            json_response(200, &Value::Array(list))
        }
        (Method::POST, ["api", "services", domain, service]) => {
            call_service(&shared, domain, service, &body)
        }
        _ => message(404, "Not found."),
    }
}

fn call_service(shared: &Shared, domain: &str, service: &str, body: &[u8]) -> Response {
    let known = services()
        .iter()
        .any(|(d, list)| *d == domain && list.iter().any(|(s, _, _)| *s == service));
    if !known {
        return message(400, &format!("Service {domain}.{service} not found."));
    }
    let data: Value = if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(body) {
            Ok(v @ Value::Object(_)) => v,
            _ => return message(400, "Data should be valid JSON."),
        }
    };
    let mut book = shared.core.change();
    book.calls.push(ServiceCall {
        domain: domain.to_owned(),
        service: service.to_owned(),
        data: data.clone(),
    });
    if (domain, service) == ("persistent_notification", "create") {
        let Some(text) = data.get("message").and_then(Value::as_str) else {
            return message(400, "message is required");
        };
        let field = |k: &str| data.get(k).and_then(Value::as_str).map(str::to_owned);
        book.notifications.push(Notification {
            title: field("title"),
            message: text.to_owned(),
            notification_id: field("notification_id"),
        });
        return json_response(200, &json!([]));
    }
    let targets: Vec<String> = match data.get("entity_id") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    };
    let mut changed = Vec::new();
    for id in targets {
        let Some((state, attributes)) = book.states.get_mut(&id) else {
            continue;
        };
        let next = match (service, state.as_str()) {
            ("turn_on", _) => "on",
            ("turn_off", _) => "off",
            ("toggle", "on") => "off",
            ("toggle", _) => "on",
            ("lock", _) => "locked",
            ("unlock", _) => "unlocked",
            _ => continue,
        };
        *state = next.to_owned();
        changed.push(state_object(&id, state, attributes));
    }
    json_response(200, &Value::Array(changed))
}

/// What the platform kit ([`crate::kit::homeassistant`]) asks of the fake
/// beyond the tests' own API.
impl FakeHomeAssistant {
    /// How many scripted failures for `path_prefix` are still to come.
    pub fn failures_left(&self, path_prefix: &str) -> usize {
        self.shared
            .core
            .read()
            .failures
            .count(|(prefix, _)| prefix == path_prefix)
    }

    /// Drops the scripted failures for `path_prefix` still to come.
    pub fn clear_failures(&self, path_prefix: &str) {
        self.shared
            .core
            .change()
            .failures
            .retain(|(prefix, _)| prefix != path_prefix);
    }
}
