//! The `ha_*` tools: read entity states and services, and call services,
//! through Home Assistant's REST API.
//!
//! Reading never asks. `ha_call_service` changes the physical world (locks,
//! heating, garage doors), so each call asks for approval through the same
//! flow as a dangerous `terminal` command, unless its `domain.service`
//! matches `platforms.homeassistant.allowed_services` (or approvals are
//! off, `approvals.mode: off`). A refusal calls nothing.
//!
//! Every id that goes into a URL path is checked against Home Assistant's
//! own shapes (`[a-z0-9_]` slugs, `domain.object_id`), so no argument can
//! reach another API path. Output is compact and bounded.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use talaria_agent::interaction::{ApprovalDecision, ApprovalRequest};
use talaria_agent::tools::guard::glob_match;
use talaria_agent::tools::terminal::DENIED_PREFIX;
use talaria_agent::tools::{Tool, ToolContext, ToolError, ToolResult};
use talaria_core::config::ApprovalMode;

use talaria_platforms::homeassistant::{ApiError, HassApi};
use talaria_platforms::homeassistant::{HomeAssistantError, HomeAssistantSettings};

/// Most characters a tool result holds.
pub const MAX_OUTPUT_CHARS: usize = 8_000;

/// Most entities `ha_list_entities` lists.
const MAX_ENTITIES: usize = 200;

/// Longest slug or id accepted.
const MAX_ID_LEN: usize = 255;

/// The tools, when `HASS_URL` and `HASS_TOKEN` are set (else none).
///
/// # Errors
/// An unusable `HASS_URL`.
pub fn ha_tools(
    settings: &HomeAssistantSettings,
) -> Result<Vec<Arc<dyn Tool>>, HomeAssistantError> {
    let Some(api) = settings.api()? else {
        return Ok(Vec::new());
    };
    let ha = Arc::new(Ha {
        api,
        allowed: settings.allowed_services.clone(),
    });
    Ok(vec![
        Arc::new(ListEntities(ha.clone())),
        Arc::new(GetState(ha.clone())),
        Arc::new(ListServices(ha.clone())),
        Arc::new(CallService(ha)),
    ])
}

/// What the four tools share.
struct Ha {
    api: HassApi,
    allowed: Vec<String>,
}

/// A Home Assistant slug: a domain or a service name.
fn is_slug(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_ID_LEN
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// `domain.object_id`, both slugs.
fn is_entity_id(s: &str) -> bool {
    s.len() <= MAX_ID_LEN
        && s.split_once('.')
            .is_some_and(|(d, o)| is_slug(d) && is_slug(o))
}

fn slug_arg<'a>(args: &'a Value, name: &str, required: bool) -> Result<Option<&'a str>, ToolError> {
    match args.get(name) {
        None | Some(Value::Null) if !required => Ok(None),
        None | Some(Value::Null) => Err(ToolError::new(format!("`{name}` is required"))),
        Some(Value::String(s)) => {
            let s = s.trim();
            if is_slug(s) {
                Ok(Some(s))
            } else {
                Err(ToolError::new(format!(
                    "`{name}` must be a Home Assistant slug (lowercase letters, digits, _), got {s:?}"
                )))
            }
        }
        Some(_) => Err(ToolError::new(format!("`{name}` must be a string"))),
    }
}

/// `entity_id` as a string, or a list of strings; each checked.
fn entity_ids(args: &Value, required: bool) -> Result<Vec<String>, ToolError> {
    let raw: Vec<&Value> = match args.get("entity_id") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items.iter().collect(),
        Some(v) => vec![v],
    };
    if raw.is_empty() && required {
        return Err(ToolError::new("`entity_id` is required"));
    }
    raw.into_iter()
        .map(|v| {
            let s = v
                .as_str()
                .ok_or_else(|| ToolError::new("`entity_id` must be a string"))?
                .trim();
            if is_entity_id(s) {
                Ok(s.to_owned())
            } else {
                Err(ToolError::new(format!(
                    "`entity_id` must look like domain.object_id (lowercase letters, digits, _), \
                     got {s:?}"
                )))
            }
        })
        .collect()
}

fn text_arg<'a>(args: &'a Value, name: &str) -> Result<Option<&'a str>, ToolError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.trim())),
        Some(_) => Err(ToolError::new(format!("`{name}` must be a string"))),
    }
}

/// A failure as the model should read it.
fn explain(e: &ApiError, what: &str) -> ToolError {
    match e {
        ApiError::Unauthorized(_) => ToolError::new(
            "HASS_TOKEN was refused by Home Assistant: the operator must create a new \
             long-lived access token",
        ),
        ApiError::NotFound => ToolError::new(format!("no {what}")),
        other => ToolError::new(other.to_string()),
    }
}

/// `text` cut to [`MAX_OUTPUT_CHARS`], saying so.
fn bounded(text: String) -> String {
    if text.chars().count() <= MAX_OUTPUT_CHARS {
        return text;
    }
    let mut cut: String = text.chars().take(MAX_OUTPUT_CHARS).collect();
    cut.push_str("\n[output cut; narrow the request]");
    cut
}

fn friendly_name(state: &Value) -> &str {
    state
        .pointer("/attributes/friendly_name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// One line per entity: `entity_id | state | friendly name`.
fn entity_line(state: &Value) -> String {
    let id = state
        .get("entity_id")
        .and_then(Value::as_str)
        .unwrap_or("?");
    let value = state.get("state").and_then(Value::as_str).unwrap_or("?");
    match friendly_name(state) {
        "" => format!("{id} | {value}"),
        name => format!("{id} | {value} | {name}"),
    }
}

struct ListEntities(Arc<Ha>);

#[async_trait]
impl Tool for ListEntities {
    fn name(&self) -> &str {
        "ha_list_entities"
    }

    fn description(&self) -> &str {
        "List Home Assistant entities as `entity_id | state | name`, optionally by domain or matching text."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "domain": {"type": "string", "description": "e.g. light, switch, sensor"},
                "search": {"type": "string", "description": "text in the id or name (an area's name works when names include it)"}
            }
        })
    }

    fn parallel_safe(&self) -> bool {
        true
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> ToolResult {
        let domain = slug_arg(&args, "domain", false)?;
        let search = text_arg(&args, "search")?
            .or(text_arg(&args, "area")?)
            .map(str::to_lowercase);
        let states = self
            .0
            .api
            .get("states")
            .await
            .map_err(|e| explain(&e, "states endpoint"))?;
        let Some(states) = states.as_array() else {
            return Err(ToolError::new("unexpected answer from Home Assistant"));
        };
        let mut matching: Vec<&Value> = states
            .iter()
            .filter(|s| {
                let id = s.get("entity_id").and_then(Value::as_str).unwrap_or("");
                domain.is_none_or(|d| id.split_once('.').is_some_and(|(sd, _)| sd == d))
                    && search.as_deref().is_none_or(|q| {
                        id.to_lowercase().contains(q) || friendly_name(s).to_lowercase().contains(q)
                    })
            })
            .collect();
        matching.sort_by_key(|s| s.get("entity_id").and_then(Value::as_str).unwrap_or(""));
        if matching.is_empty() {
            return Ok("no matching entities".to_owned());
        }
        let total = matching.len();
        let mut out: Vec<String> = matching
            .iter()
            .take(MAX_ENTITIES)
            .map(|s| entity_line(s))
            .collect();
        if total > MAX_ENTITIES {
            out.push(format!(
                "... and {} more; narrow with domain or search",
                total - MAX_ENTITIES
            ));
        }
        Ok(bounded(out.join("\n")))
    }
}

struct GetState(Arc<Ha>);

#[async_trait]
impl Tool for GetState {
    fn name(&self) -> &str {
        "ha_get_state"
    }

    fn description(&self) -> &str {
        "Get one Home Assistant entity's state and attributes."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"entity_id": {"type": "string", "description": "e.g. light.kitchen"}},
            "required": ["entity_id"]
        })
    }

    fn parallel_safe(&self) -> bool {
        true
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> ToolResult {
        let ids = entity_ids(&args, true)?;
        let [id] = ids.as_slice() else {
            return Err(ToolError::new("`entity_id` must be one entity"));
        };
        let state = self
            .0
            .api
            .get(&format!("states/{id}"))
            .await
            .map_err(|e| explain(&e, &format!("entity {id}")))?;
        let compact = json!({
            "entity_id": state.get("entity_id"),
            "state": state.get("state"),
            "attributes": state.get("attributes"),
            "last_changed": state.get("last_changed"),
        });
        Ok(bounded(compact.to_string()))
    }
}

struct ListServices(Arc<Ha>);

#[async_trait]
impl Tool for ListServices {
    fn name(&self) -> &str {
        "ha_list_services"
    }

    fn description(&self) -> &str {
        "List Home Assistant services (all domains briefly, or one domain's services with their fields)."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"domain": {"type": "string", "description": "e.g. light"}}
        })
    }

    fn parallel_safe(&self) -> bool {
        true
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> ToolResult {
        let domain = slug_arg(&args, "domain", false)?;
        let all = self
            .0
            .api
            .get("services")
            .await
            .map_err(|e| explain(&e, "services endpoint"))?;
        let Some(all) = all.as_array() else {
            return Err(ToolError::new("unexpected answer from Home Assistant"));
        };
        let services_of = |entry: &Value| -> Vec<(String, Value)> {
            let mut list: Vec<(String, Value)> = entry
                .get("services")
                .and_then(Value::as_object)
                .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default();
            list.sort_by(|a, b| a.0.cmp(&b.0));
            list
        };
        let name_of = |entry: &Value| {
            entry
                .get("domain")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        let Some(domain) = domain else {
            let mut lines: Vec<String> = all
                .iter()
                .map(|entry| {
                    let names: Vec<String> =
                        services_of(entry).into_iter().map(|(k, _)| k).collect();
                    format!("{}: {}", name_of(entry), names.join(", "))
                })
                .collect();
            lines.sort();
            return Ok(bounded(lines.join("\n")));
        };
        let Some(entry) = all.iter().find(|e| name_of(e) == domain) else {
            return Err(ToolError::new(format!("no services in domain {domain}")));
        };
        let lines: Vec<String> = services_of(entry)
            .into_iter()
            .map(|(name, spec)| {
                let description = spec
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let mut fields: Vec<&str> = spec
                    .get("fields")
                    .and_then(Value::as_object)
                    .map(|f| f.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                fields.sort_unstable();
                let mut line = format!("{domain}.{name}");
                if !description.is_empty() {
                    line.push_str(&format!(": {description}"));
                }
                if !fields.is_empty() {
                    line.push_str(&format!(" (fields: {})", fields.join(", ")));
                }
                line
            })
            .collect();
        Ok(bounded(lines.join("\n")))
    }
}

struct CallService(Arc<Ha>);

impl CallService {
    /// Whether the call may run: allowed by config, approved for the
    /// session, or approved now. `Err` holds the message for the model.
    async fn authorize(&self, service: &str, shown: &str, ctx: &ToolContext) -> Result<(), String> {
        if ctx.config.approvals.mode == ApprovalMode::Off
            || self.0.allowed.iter().any(|p| glob_match(p, service))
        {
            return Ok(());
        }
        let key = format!("homeassistant:{service}");
        if ctx
            .session
            .approved_patterns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&key)
        {
            return Ok(());
        }
        let request = ApprovalRequest {
            command: ctx.redactor.redact(shown),
            reason: format!(
                "Home Assistant service {service} acts on the house (not in \
                 platforms.homeassistant.allowed_services)"
            ),
            pattern_key: key.clone(),
            always: None,
        };
        let wait = Duration::from_secs(ctx.config.approvals.timeout_secs.max(1));
        let decision = tokio::select! {
            d = tokio::time::timeout(wait, ctx.interaction.approve(&request)) => {
                d.unwrap_or(ApprovalDecision::TimedOut)
            }
            _ = ctx.cancel.cancelled() => ApprovalDecision::Deny,
        };
        match decision {
            ApprovalDecision::Once => Ok(()),
            // "Always" is kept for the session only: a permanent allowance
            // belongs in allowed_services, where the operator can see it.
            ApprovalDecision::Session | ApprovalDecision::Always => {
                ctx.session
                    .approved_patterns
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key);
                Ok(())
            }
            ApprovalDecision::Deny => Err(format!(
                "{DENIED_PREFIX} The user did NOT allow calling {service}; nothing was called. \
                 Do not retry it or reach the same result another way; tell the user what you \
                 wanted to do."
            )),
            ApprovalDecision::TimedOut => Err(format!(
                "{DENIED_PREFIX} No answer came in time, and silence is not consent; {service} \
                 was not called. Do not retry it; tell the user what you wanted to do."
            )),
        }
    }
}

#[async_trait]
impl Tool for CallService {
    fn name(&self) -> &str {
        "ha_call_service"
    }

    fn description(&self) -> &str {
        "Call a Home Assistant service (e.g. light.turn_on) on entities; may need the user's approval."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "domain": {"type": "string", "description": "e.g. light"},
                "service": {"type": "string", "description": "e.g. turn_on"},
                "entity_id": {"type": "string", "description": "target entity, e.g. light.kitchen"},
                "data": {"type": "object", "description": "service fields, e.g. {\"brightness_pct\": 50}"}
            },
            "required": ["domain", "service"]
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolResult {
        let domain = slug_arg(&args, "domain", true)?.unwrap_or_default();
        let service = slug_arg(&args, "service", true)?.unwrap_or_default();
        let entities = entity_ids(&args, false)?;
        let mut data: Map<String, Value> = match args.get("data") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(_) => return Err(ToolError::new("`data` must be an object")),
        };
        match entities.as_slice() {
            [] => {}
            [one] => {
                data.insert("entity_id".to_owned(), json!(one));
            }
            many => {
                data.insert("entity_id".to_owned(), json!(many));
            }
        }
        let body = Value::Object(data);
        let name = format!("{domain}.{service}");
        let shown = format!("{name} {body}");
        self.authorize(&name, &shown, ctx)
            .await
            .map_err(ToolError::new)?;
        let changed = self
            .0
            .api
            .post(&format!("services/{domain}/{service}"), &body)
            .await
            .map_err(|e| explain(&e, &format!("service {name}")))?;
        let lines: Vec<String> = changed
            .as_array()
            .map(|states| states.iter().map(entity_line).collect())
            .unwrap_or_default();
        if lines.is_empty() {
            Ok(format!("called {name}; no entity reported a change"))
        } else {
            Ok(bounded(format!(
                "called {name}; changed:\n{}",
                lines.join("\n")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_refuse_traversal() {
        assert!(is_slug("light"));
        assert!(is_slug("turn_on"));
        assert!(is_entity_id("light.kitchen_2"));
        for bad in [
            "", "Light", "a/b", "..", "a.b", "a b", "a%2f", "a?x=1", "a#b",
        ] {
            assert!(!is_slug(bad), "{bad}");
        }
        for bad in [
            "light",
            "light.",
            ".kitchen",
            "light.kitchen/../../config",
            "../services/lock/unlock",
            "light.kitchen?x=1",
            "light.a.b",
            "LIGHT.kitchen",
        ] {
            assert!(!is_entity_id(bad), "{bad}");
        }
        assert!(entity_ids(&json!({"entity_id": ["light.a", "light.b"]}), true).is_ok());
        assert!(entity_ids(&json!({"entity_id": ["light.a", "../x"]}), true).is_err());
        assert!(entity_ids(&json!({}), true).is_err());
        assert!(slug_arg(&json!({"domain": "light/../x"}), "domain", true).is_err());
    }

    #[test]
    fn output_is_bounded() {
        let long = "x".repeat(MAX_OUTPUT_CHARS + 10);
        let out = bounded(long);
        assert!(out.ends_with("[output cut; narrow the request]"));
        assert!(out.chars().count() < MAX_OUTPUT_CHARS + 50);
    }
}
