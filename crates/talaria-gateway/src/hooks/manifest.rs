//! `HOOK.yaml`: what a hook subscribes to and how long a run may take.

use std::time::Duration;

use serde::Deserialize;
use talaria_core::commands::{self, Availability};

use super::{DEFAULT_TIMEOUT, MANIFEST, MAX_TIMEOUT, events};

/// What an `events` entry matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventPattern {
    /// One event, e.g. `agent:end` or `command:new`.
    Exact(String),
    /// `<prefix>:*`: every event starting with `<prefix>:`.
    Prefix(String),
}

impl std::fmt::Display for EventPattern {
    /// As a manifest writes it: `agent:end`, `command:*`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EventPattern::Exact(name) => f.write_str(name),
            EventPattern::Prefix(prefix) => write!(f, "{prefix}:*"),
        }
    }
}

impl EventPattern {
    /// Reads one `events` entry. Command names are resolved to their
    /// canonical form, so `command:reset` subscribes to `/new`.
    ///
    /// # Errors
    /// A message saying why the entry names nothing the gateway emits.
    pub fn parse(entry: &str) -> Result<EventPattern, String> {
        let entry = entry.trim().to_ascii_lowercase();
        if events::FIXED.contains(&entry.as_str()) {
            return Ok(EventPattern::Exact(entry));
        }
        let Some((prefix, rest)) = entry.split_once(':') else {
            return Err(format!(
                "`{entry}` is not an event (events look like `agent:end`)"
            ));
        };
        if rest == "*" {
            return if events::PREFIXES.contains(&prefix) {
                Ok(EventPattern::Prefix(prefix.to_owned()))
            } else {
                Err(format!("`{entry}`: no events start with `{prefix}:`"))
            };
        }
        if prefix == events::COMMAND_PREFIX {
            return match commands::resolve(rest) {
                Some(def) if def.availability != Availability::CliOnly => {
                    Ok(EventPattern::Exact(events::command(def.name)))
                }
                Some(_) => Err(format!("`/{rest}` is not a chat command")),
                None => Err(format!("`/{rest}` is not a known command")),
            };
        }
        Err(format!("`{entry}` is not an event the gateway emits"))
    }

    /// Whether `event` is one this pattern subscribes to.
    pub fn matches(&self, event: &str) -> bool {
        match self {
            EventPattern::Exact(name) => name == event,
            EventPattern::Prefix(prefix) => event
                .strip_prefix(prefix.as_str())
                .is_some_and(|rest| rest.starts_with(':')),
        }
    }
}

/// `HOOK.yaml` as written.
#[derive(Debug, Deserialize)]
struct RawManifest {
    name: Option<String>,
    description: Option<String>,
    #[serde(default)]
    events: Vec<String>,
    timeout_secs: Option<u64>,
}

/// A parsed, checked manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The hook's name: the manifest's, else its folder's.
    pub name: String,
    /// What it does, for listings.
    pub description: String,
    /// What it subscribes to, without repeats.
    pub events: Vec<EventPattern>,
    /// How long one run may take, clamped to the limits.
    pub timeout: Duration,
    /// Entries that were ignored, and why: the hook still loads when at
    /// least one entry is usable.
    pub warnings: Vec<String>,
}

impl Manifest {
    /// Parses `HOOK.yaml` text of the hook in folder `folder`.
    ///
    /// # Errors
    /// Why the hook cannot load: the YAML does not parse, the name is
    /// unusable, or no usable event is listed.
    pub fn parse(text: &str, folder: &str) -> Result<Manifest, String> {
        if text.trim().is_empty() {
            return Err(format!("{MANIFEST} is empty"));
        }
        let raw: RawManifest =
            serde_saphyr::from_str(text).map_err(|e| format!("{MANIFEST} does not parse: {e}"))?;
        let name = raw
            .name
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| folder.to_owned());
        talaria_core::ids::validate_logical_key(&name)
            .map_err(|e| format!("the name `{name}` is unusable: {e}"))?;
        let mut warnings = Vec::new();
        let mut patterns: Vec<EventPattern> = Vec::new();
        for entry in &raw.events {
            match EventPattern::parse(entry) {
                Ok(p) if !patterns.contains(&p) => patterns.push(p),
                Ok(_) => {}
                Err(why) => warnings.push(format!("event ignored: {why}")),
            }
        }
        if patterns.is_empty() {
            let why = if raw.events.is_empty() {
                "it lists no events".to_owned()
            } else {
                format!("none of its events is usable ({})", warnings.join("; "))
            };
            return Err(why);
        }
        let timeout = match raw.timeout_secs {
            None => DEFAULT_TIMEOUT,
            Some(0) => {
                warnings.push("timeout_secs: 0 is too short; using 1".to_owned());
                Duration::from_secs(1)
            }
            Some(s) if Duration::from_secs(s) > MAX_TIMEOUT => {
                warnings.push(format!(
                    "timeout_secs: {s} is over the limit; using {}",
                    MAX_TIMEOUT.as_secs()
                ));
                MAX_TIMEOUT
            }
            Some(s) => Duration::from_secs(s),
        };
        Ok(Manifest {
            name,
            description: raw.description.unwrap_or_default(),
            events: patterns,
            timeout,
            warnings,
        })
    }
}
