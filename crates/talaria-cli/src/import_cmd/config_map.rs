//! The ancestor's `config.yaml` in Talaria's keys.
//!
//! Both configurations are YAML trees with much the same shape, but not
//! the same keys: this module maps, key by key, what has an equivalent,
//! notes what maps with a change of meaning, and lists every other key
//! (with a value) so nothing is dropped silently. The result is loaded as
//! Talaria loads its configuration before anything is written.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::Context;
use serde_json::{Map, Value};
use talaria_core::Home;
use talaria_core::config::ProviderKind;

use super::Section;
use super::files::write_atomic;

/// The mapped configuration and what the mapping noticed.
pub struct ConfigPlan {
    /// The YAML to write; `None` when the ancestor has no config.yaml.
    text: Option<String>,
    /// Keys mapped with a change of meaning, or values left out.
    notes: Vec<String>,
    /// Keys with a value and no Talaria equivalent, dotted.
    unmapped: Vec<String>,
    /// How many keys were carried over.
    mapped: usize,
}

/// A mapping being built: the output tree and the source keys used.
struct Mapper<'a> {
    src: &'a Map<String, Value>,
    out: Map<String, Value>,
    used: BTreeSet<String>,
    notes: Vec<String>,
    mapped: usize,
}

impl<'a> Mapper<'a> {
    /// The source value at a dotted path.
    fn get(&self, path: &str) -> Option<&'a Value> {
        let mut parts = path.split('.');
        let mut v = self.src.get(parts.next()?)?;
        for p in parts {
            v = v.get(p)?;
        }
        Some(v)
    }

    /// Marks a source path (and everything under it) as dealt with.
    fn used(&mut self, path: &str) {
        self.used.insert(path.to_owned());
    }

    /// Sets a dotted output path.
    fn set(&mut self, path: &str, value: Value) {
        let parts: Vec<&str> = path.split('.').collect();
        let mut node = &mut self.out;
        for p in &parts[..parts.len() - 1] {
            let entry = node
                .entry((*p).to_owned())
                .or_insert_with(|| Value::Object(Map::new()));
            if !entry.is_object() {
                *entry = Value::Object(Map::new());
            }
            let Value::Object(next) = entry else { return };
            node = next;
        }
        node.insert(parts[parts.len() - 1].to_owned(), value);
        self.mapped += 1;
    }

    /// Copies `from` to `to` when it has a value.
    fn copy(&mut self, from: &str, to: &str) {
        if let Some(v) = self.get(from).filter(|v| !empty(v)) {
            self.set(to, v.clone());
        }
        if self.get(from).is_some() {
            self.used(from);
        }
    }
}

/// Whether a value says nothing (null, "", [] or {}): such keys are
/// neither carried nor listed.
fn empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.trim().is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// The Talaria provider the ancestor's provider name is, if there is one.
fn provider(name: &str) -> Option<ProviderKind> {
    serde_json::from_value(Value::String(name.trim().to_lowercase())).ok()
}

/// Every dotted path to a value under `v` (lists are values).
fn leaves(prefix: &str, v: &Value, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(&path, v, out);
            }
        }
        _ => out.push((prefix.to_owned(), v.clone())),
    }
}

fn map_config(src: &Map<String, Value>) -> (Map<String, Value>, Vec<String>, Vec<String>, usize) {
    let mut m = Mapper {
        src,
        out: Map::new(),
        used: BTreeSet::new(),
        notes: Vec::new(),
        mapped: 0,
    };

    // model: a bare name, or a mapping.
    match m.get("model") {
        Some(Value::String(name)) if !name.trim().is_empty() => {
            m.set("model.default", Value::String(name.trim().to_owned()));
            m.used("model");
        }
        Some(Value::Object(_)) => {
            if m.get("model.default").is_some() {
                m.copy("model.default", "model.default");
            } else {
                m.copy("model.model", "model.default");
            }
            if let Some(Value::String(p)) = m.get("model.provider") {
                m.used("model.provider");
                match p.trim() {
                    "" | "auto" => {}
                    p => match provider(p) {
                        Some(kind) => m.set(
                            "model.provider",
                            serde_json::to_value(kind).unwrap_or(Value::Null),
                        ),
                        None => m.notes.push(format!(
                            "model.provider `{p}` has no Talaria equivalent; Talaria's default (custom) applies"
                        )),
                    },
                }
            }
            for key in [
                "base_url",
                "api_key",
                "context_length",
                "max_tokens",
                "temperature",
            ] {
                m.copy(&format!("model.{key}"), &format!("model.{key}"));
            }
        }
        Some(_) => m.used("model"),
        None => {}
    }

    // Fallbacks: the list, and the older single `fallback_model`.
    let mut fallbacks = Vec::new();
    for key in ["fallback_providers", "fallback_model"] {
        let entries: Vec<&Value> = match m.get(key) {
            Some(Value::Array(list)) => list.iter().collect(),
            Some(v @ Value::Object(_)) => vec![v],
            _ => Vec::new(),
        };
        if m.get(key).is_some() {
            m.used(key);
        }
        for (i, entry) in entries.into_iter().enumerate() {
            let (Some(p), Some(model)) = (
                entry.get("provider").and_then(|v| v.as_str()),
                entry.get("model").and_then(|v| v.as_str()),
            ) else {
                m.notes
                    .push(format!("{key}[{i}] has no provider or model; left out"));
                continue;
            };
            let Some(kind) = provider(p) else {
                m.notes.push(format!(
                    "{key}[{i}]: provider `{p}` has no Talaria equivalent; left out"
                ));
                continue;
            };
            let mut f = Map::new();
            f.insert(
                "provider".into(),
                serde_json::to_value(kind).unwrap_or(Value::Null),
            );
            f.insert("model".into(), Value::String(model.to_owned()));
            for k in ["base_url", "api_key"] {
                if let Some(v) = entry.get(k).filter(|v| !empty(v)) {
                    f.insert(k.into(), v.clone());
                }
            }
            fallbacks.push(Value::Object(f));
        }
    }
    if !fallbacks.is_empty() {
        m.set("fallback_providers", Value::Array(fallbacks));
    }

    // Toolsets: per platform, and the terminal's own list.
    let known = |list: &Value| -> (Vec<Value>, Vec<String>) {
        let mut keep = Vec::new();
        let mut unknown = Vec::new();
        for name in list
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str())
        {
            if talaria_core::toolsets::is_known(name) {
                keep.push(Value::String(name.to_owned()));
            } else {
                unknown.push(name.to_owned());
            }
        }
        (keep, unknown)
    };
    if let Some(Value::Object(platforms)) = m.get("platform_toolsets") {
        m.used("platform_toolsets");
        for (platform, list) in platforms {
            let (keep, unknown) = known(list);
            if !unknown.is_empty() {
                m.notes.push(format!(
                    "platform_toolsets.{platform}: no Talaria toolset named {}",
                    unknown.join(", ")
                ));
            }
            if !keep.is_empty() {
                m.set(&format!("platform_toolsets.{platform}"), Value::Array(keep));
            }
        }
    }
    if let Some(list @ Value::Array(_)) = m.get("toolsets") {
        m.used("toolsets");
        let (keep, unknown) = known(list);
        if !unknown.is_empty() {
            m.notes.push(format!(
                "toolsets: no Talaria toolset named {}",
                unknown.join(", ")
            ));
        }
        let cli_set = m
            .out
            .get("platform_toolsets")
            .and_then(|p| p.get("cli"))
            .is_some();
        if !keep.is_empty() && !cli_set {
            m.set("platform_toolsets.cli", Value::Array(keep));
        }
    }

    // Approvals: Talaria asks or does not; the ancestor's "smart" mode
    // (a model judging each command) has no equivalent, and asking is
    // the safe reading of it.
    if let Some(Value::String(mode)) = m.get("approvals.mode") {
        m.used("approvals.mode");
        match mode.trim() {
            "manual" | "off" => m.set("approvals.mode", Value::String(mode.trim().to_owned())),
            "smart" => {
                m.set("approvals.mode", Value::String("manual".into()));
                m.notes.push(
                    "approvals.mode `smart` (a model decides) has no Talaria equivalent: imported as `manual` (you are asked)".into(),
                );
            }
            other => m.notes.push(format!(
                "approvals.mode `{other}` has no Talaria equivalent; left out"
            )),
        }
    }
    m.copy("approvals.timeout", "approvals.timeout_secs");
    m.copy("command_allowlist", "command_allowlist");

    // MCP servers: the same keys on both sides.
    if let Some(Value::Object(servers)) = m.get("mcp_servers") {
        for (name, server) in servers {
            let Value::Object(fields) = server else {
                continue;
            };
            for key in fields.keys() {
                if matches!(
                    key.as_str(),
                    "command"
                        | "args"
                        | "env"
                        | "cwd"
                        | "url"
                        | "headers"
                        | "enabled"
                        | "timeout"
                        | "connect_timeout"
                ) {
                    m.copy(
                        &format!("mcp_servers.{name}.{key}"),
                        &format!("mcp_servers.{name}.{key}"),
                    );
                }
            }
            for key in ["include", "exclude"] {
                m.copy(
                    &format!("mcp_servers.{name}.tools.{key}"),
                    &format!("mcp_servers.{name}.tools.{key}"),
                );
            }
        }
    }

    m.copy("memory.memory_enabled", "memory.enabled");
    m.copy("memory.memory_char_limit", "memory.memory_char_limit");
    m.copy("memory.user_char_limit", "memory.user_char_limit");
    for key in ["enabled", "threshold", "protect_first_n", "protect_last_n"] {
        m.copy(&format!("compression.{key}"), &format!("compression.{key}"));
    }
    m.copy("agent.max_turns", "agent.max_turns");
    m.copy("agent.api_max_retries", "agent.api_max_retries");

    // The terminal: the backends both have, the timeout, the variables
    // commands inherit, and a working folder other than "here".
    if let Some(Value::String(backend)) = m.get("terminal.backend") {
        m.used("terminal.backend");
        match backend.trim() {
            b @ ("local" | "docker" | "ssh") => m.set("terminal.backend", Value::String(b.into())),
            other => m.notes.push(format!(
                "terminal.backend `{other}` has no Talaria equivalent; Talaria's default (local) applies"
            )),
        }
    }
    m.copy("terminal.timeout", "terminal.timeout_secs");
    m.copy("terminal.env_passthrough", "terminal.env_passthrough");
    if let Some(Value::String(cwd)) = m.get("terminal.cwd") {
        m.used("terminal.cwd");
        if !matches!(cwd.trim(), "" | ".") {
            m.set("terminal.cwd", Value::String(cwd.trim().to_owned()));
        }
    }

    for key in [
        "enabled",
        "interval_hours",
        "stale_after_days",
        "archive_after_days",
    ] {
        m.copy(&format!("curator.{key}"), &format!("curator.{key}"));
    }
    for key in ["mode", "idle_minutes", "at_hour"] {
        m.copy(
            &format!("session_reset.{key}"),
            &format!("session_reset.{key}"),
        );
    }
    m.copy("timezone", "cron.timezone");
    m.copy("delegation.model", "delegation.model");
    m.copy("delegation.max_iterations", "delegation.max_iterations");
    m.copy(
        "delegation.max_concurrent_children",
        "delegation.max_concurrent",
    );

    // Everything else with a value is listed.
    let mut all = Vec::new();
    leaves("", &Value::Object(src.clone()), &mut all);
    let unmapped = all
        .into_iter()
        .filter(|(path, v)| {
            !empty(v)
                && !m
                    .used
                    .iter()
                    .any(|u| path == u || path.starts_with(&format!("{u}.")))
        })
        .map(|(path, _)| path)
        .collect();
    (m.out, m.notes, unmapped, m.mapped)
}

pub fn plan(source: &Path) -> anyhow::Result<ConfigPlan> {
    let path = source.join("config.yaml");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(ConfigPlan {
                text: None,
                notes: Vec::new(),
                unmapped: Vec::new(),
                mapped: 0,
            });
        }
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let tree: Value = if text.trim().is_empty() {
        Value::Object(Map::new())
    } else {
        serde_saphyr::from_str(&text)
            .with_context(|| format!("{} is not YAML this command can read", path.display()))?
    };
    let Value::Object(src) = tree else {
        anyhow::bail!("{} is not a mapping of settings", path.display());
    };
    let (out, notes, unmapped, mapped) = map_config(&src);
    let mut yaml = String::from("# Imported from hermes-agent by `talaria import hermes`.\n");
    if !out.is_empty() {
        yaml.push_str(&serde_saphyr::to_string(&Value::Object(out))?);
    }
    check_loads(&yaml)?;
    Ok(ConfigPlan {
        text: Some(yaml),
        notes,
        unmapped,
        mapped,
    })
}

/// Loads `yaml` as Talaria would, in a scratch home holding only it, so
/// a configuration that would not start is never written.
fn check_loads(yaml: &str) -> anyhow::Result<()> {
    let scratch = tempfile::tempdir().context("cannot make a scratch folder")?;
    let home = Home::at(scratch.path());
    std::fs::write(home.config_file(), yaml)?;
    crate::sections::load(&home).map_err(|e| {
        anyhow::anyhow!(
            "the configuration mapped from hermes-agent would not load, so nothing was imported: {e}"
        )
    })?;
    Ok(())
}

pub fn apply(home: &Home, plan: &ConfigPlan, dry_run: bool) -> anyhow::Result<Section> {
    let mut s = Section::new("config.yaml");
    let Some(text) = &plan.text else {
        s.line("the hermes-agent home has no config.yaml");
        return Ok(s);
    };
    let ours = home.config_file();
    let beside = home.root().join("config.imported.yaml");
    let current = std::fs::read_to_string(&ours).ok();
    let imported = std::fs::read_to_string(&beside).ok();
    s.line(format!(
        "{} carried over",
        crate::count(plan.mapped, "key", "keys")
    ));
    if current.as_deref() == Some(text.as_str()) || imported.as_deref() == Some(text.as_str()) {
        s.line("already imported, unchanged");
    } else if current.is_none() {
        s.line(format!(
            "{} {}",
            super::verb(dry_run, "to be written to", "written to"),
            ours.display()
        ));
        if !dry_run {
            write_atomic(&ours, text, true)?;
        }
    } else {
        s.line(format!(
            "{} exists and is kept; the imported settings {} beside it to {} to merge by hand",
            ours.display(),
            super::verb(dry_run, "would be written", "are written"),
            beside.display()
        ));
        if !dry_run {
            write_atomic(&beside, text, true)?;
        }
    }
    for note in &plan.notes {
        s.line(format!("note: {note}"));
    }
    if !plan.unmapped.is_empty() {
        s.line(format!(
            "{} without a Talaria equivalent, not imported:",
            crate::count(plan.unmapped.len(), "key", "keys")
        ));
        // Grouped by section, so a full config of the ancestor's reads
        // as a few dozen lines rather than hundreds.
        let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for path in &plan.unmapped {
            let (head, rest) = path.split_once('.').unwrap_or((path.as_str(), ""));
            let keys = groups.entry(head).or_default();
            if !rest.is_empty() {
                keys.push(rest);
            }
        }
        for (head, keys) in groups {
            if keys.is_empty() {
                s.line(format!("  {head}"));
            } else {
                s.line(format!("  {head}: {}", keys.join(", ")));
            }
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(yaml: &str) -> (Value, Vec<String>, Vec<String>) {
        let Value::Object(src) = serde_saphyr::from_str::<Value>(yaml).unwrap() else {
            panic!("not a mapping")
        };
        let (out, notes, unmapped, _) = map_config(&src);
        (Value::Object(out), notes, unmapped)
    }

    #[test]
    fn the_model_fallbacks_and_approvals_map_and_the_rest_is_listed() {
        let (out, notes, unmapped) = map(
            "model:\n  default: qwen3\n  provider: custom\n  base_url: http://127.0.0.1:8080/v1\n  \
             reasoning_effort: high\n\
             fallback_providers:\n  - {provider: openrouter, model: x/y}\n  - {provider: copilot, model: z}\n\
             approvals: {mode: smart, timeout: 30, cron_mode: deny}\n\
             toolsets: [hermes-cli]\nstreaming: {enabled: false}\nprivacy: {redact_pii: true}\nhooks: {}\n",
        );
        assert_eq!(out["model"]["default"], "qwen3");
        assert_eq!(out["model"]["provider"], "custom");
        assert_eq!(out["fallback_providers"][0]["provider"], "openrouter");
        assert_eq!(out["fallback_providers"].as_array().unwrap().len(), 1);
        assert_eq!(out["approvals"]["mode"], "manual");
        assert_eq!(out["approvals"]["timeout_secs"], 30);
        assert_eq!(out["platform_toolsets"]["cli"][0], "hermes-cli");
        assert!(notes.iter().any(|n| n.contains("copilot")), "{notes:?}");
        assert!(notes.iter().any(|n| n.contains("smart")), "{notes:?}");
        for key in [
            "model.reasoning_effort",
            "approvals.cron_mode",
            "streaming.enabled",
            "privacy.redact_pii",
        ] {
            assert!(unmapped.contains(&key.to_owned()), "{key} in {unmapped:?}");
        }
        // Empty values say nothing and are not listed.
        assert!(!unmapped.iter().any(|k| k.starts_with("hooks")));
    }

    #[test]
    fn a_bare_model_name_is_the_default() {
        let (out, _, unmapped) = map("model: gpt-4o\n");
        assert_eq!(out["model"]["default"], "gpt-4o");
        assert!(unmapped.is_empty());
    }
}
