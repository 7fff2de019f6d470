//! Parsing, defaults from the environment, validation and [`load`]: from
//! files to a checked [`Config`].

use super::*;

impl Config {
    /// Parses YAML text. `origin` names the file in messages.
    pub fn parse(text: &str, origin: &Path) -> Result<(Config, Vec<String>), ConfigError> {
        let value: serde_json::Value =
            serde_saphyr::from_str(text).map_err(|e| yaml_errors::syntax(text, origin, &e))?;
        // An empty file parses as null: that is "all defaults", not an error.
        let value = if value.is_null() {
            serde_json::Value::Object(Default::default())
        } else {
            value
        };
        // Whether the user chose the window, before the default fills it in.
        let context_length_set = value
            .pointer("/model/context_length")
            .is_some_and(|v| !v.is_null());
        let mut unknown = Vec::new();
        let mut on_unknown = |path: serde_ignored::Path<'_>| unknown.push(path.to_string());
        let de = serde_ignored::Deserializer::new(value, &mut on_unknown);
        let mut config: Config = serde_path_to_error::deserialize(de)
            .map_err(|e| yaml_errors::invalid(text, origin, e))?;
        config.model.context_length_set = context_length_set;
        config
            .validate(origin)
            .map_err(|e| yaml_errors::with_line(text, e))?;
        let warnings = unknown
            .into_iter()
            .map(|k| format!("{}: unknown key `{k}` (ignored)", origin.display()))
            .collect();
        Ok((config, warnings))
    }

    fn validate(&self, origin: &Path) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: &str| ConfigError::Invalid {
            path: origin.to_owned(),
            key: key.to_owned(),
            line: None,
            message: message.to_owned(),
        };
        let url_ok = is_http_url;
        if let Some(u) = &self.model.base_url
            && !url_ok(u)
        {
            return Err(invalid(
                "model.base_url",
                "expected an http:// or https:// URL",
            ));
        }
        for (i, f) in self.fallback_providers.iter().enumerate() {
            if let Some(u) = &f.base_url
                && !url_ok(u)
            {
                return Err(invalid(
                    &format!("fallback_providers[{i}].base_url"),
                    "expected an http:// or https:// URL",
                ));
            }
            if f.model.trim().is_empty() {
                return Err(invalid(
                    &format!("fallback_providers[{i}].model"),
                    "expected a model name",
                ));
            }
        }
        if self.session_reset.at_hour > 23 {
            return Err(invalid(
                "session_reset.at_hour",
                "expected an hour from 0 to 23",
            ));
        }
        if self.agent.max_turns == 0 {
            return Err(invalid(
                "agent.max_turns",
                "expected an integer of at least 1",
            ));
        }
        if self.agent.tool_output_max_chars < 1000 {
            return Err(invalid(
                "agent.tool_output_max_chars",
                "expected an integer of at least 1000",
            ));
        }
        if !(self.compression.threshold > 0.0 && self.compression.threshold <= 1.0) {
            return Err(invalid(
                "compression.threshold",
                "expected a number above 0 and at most 1",
            ));
        }
        for (name, server) in &self.mcp_servers {
            let key = |field: &str| format!("mcp_servers.{name}{field}");
            if !valid_mcp_server_name(name) {
                return Err(invalid(
                    &key(""),
                    "a server name is letters, digits, `_` and `-` (at most 32)",
                ));
            }
            match (&server.command, &server.url) {
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        &key(""),
                        "give either `command` (stdio) or `url` (HTTP), not both",
                    ));
                }
                (None, None) => {
                    return Err(invalid(
                        &key(""),
                        "give `command` (a program spoken to over stdio) or `url` (a Streamable HTTP endpoint)",
                    ));
                }
                (Some(c), None) if c.trim().is_empty() => {
                    return Err(invalid(&key(".command"), "expected a program to run"));
                }
                (None, Some(u)) if !url_ok(u) => {
                    return Err(invalid(&key(".url"), "expected an http:// or https:// URL"));
                }
                _ => {}
            }
            if server.timeout == 0 || server.connect_timeout == 0 {
                return Err(invalid(
                    &key(".timeout"),
                    "timeouts are whole seconds, at least 1",
                ));
            }
        }
        if let Some((key, expected)) = self.code_execution.problem() {
            return Err(invalid(key, expected));
        }
        // A limit of nothing would refuse every file and every image.
        if self.media.max_bytes == 0 {
            return Err(invalid(
                "media.max_bytes",
                "expected a number of bytes, at least 1",
            ));
        }
        if self.media.image_max_px == 0 {
            return Err(invalid(
                "media.image_max_px",
                "expected a number of pixels, at least 1",
            ));
        }
        let blank = |c: &Option<String>| c.as_deref().is_none_or(|c| c.trim().is_empty());
        if self.stt.provider == Some(SttProvider::Command) && blank(&self.stt.command) {
            return Err(invalid(
                "stt.command",
                "provider `command` needs the program to run, with {path} for the audio file",
            ));
        }
        if self.tts.provider == Some(TtsProvider::Command) && blank(&self.tts.command) {
            return Err(invalid(
                "tts.command",
                "provider `command` needs the program to run, with {output} for the file it writes",
            ));
        }
        for (key, secs) in [
            ("stt.timeout_secs", self.stt.timeout_secs),
            ("tts.timeout_secs", self.tts.timeout_secs),
            ("image_gen.timeout_secs", self.image_gen.timeout_secs),
        ] {
            if secs == 0 {
                return Err(invalid(key, "expected a number of seconds, at least 1"));
            }
        }
        for (key, url) in [
            ("stt.base_url", &self.stt.base_url),
            ("tts.base_url", &self.tts.base_url),
            ("image_gen.base_url", &self.image_gen.base_url),
        ] {
            if let Some(u) = url
                && !url_ok(u)
            {
                return Err(invalid(key, "expected an http:// or https:// URL"));
            }
        }
        self.validate_web(&invalid)?;
        if let Some((key, expected)) = self.delegation.problem() {
            return Err(invalid(key, expected));
        }
        if let Some((key, expected)) = self
            .budget
            .problem()
            .or_else(|| prices_problem(&self.prices))
        {
            return Err(invalid(&key, expected));
        }
        if self.curator.archive_after_days <= self.curator.stale_after_days {
            return Err(invalid(
                "curator.archive_after_days",
                "expected more days than curator.stale_after_days",
            ));
        }
        match self.memory.provider.as_deref() {
            None | Some("mem0") => {}
            Some(other) => {
                return Err(invalid(
                    "memory.provider",
                    &format!("`{other}` is not a memory provider Talaria knows (mem0)"),
                ));
            }
        }
        if !url_ok(&self.memory.mem0.base_url) {
            return Err(invalid(
                "memory.mem0.base_url",
                "expected an http:// or https:// URL",
            ));
        }
        if let Err(e) = self.cron.zone() {
            return Err(invalid("cron.timezone", &e));
        }
        if self.cron.max_parallel == 0 {
            return Err(invalid(
                "cron.max_parallel",
                "expected an integer of at least 1",
            ));
        }
        if self.cron.output_retention == 0 {
            return Err(invalid(
                "cron.output_retention",
                "expected an integer of at least 1",
            ));
        }
        if self.model.context_length < 1024 {
            return Err(invalid(
                "model.context_length",
                "expected an integer of at least 1024",
            ));
        }
        Ok(())
    }

    /// The primary endpoint, or a message saying exactly what to set.
    pub fn primary_endpoint(&self, env: &Env) -> Result<Endpoint, String> {
        let provider = self.model.provider;
        // The environment wins over the file, so one run can point at
        // another model or server without editing config.yaml.
        let model = env
            .get("TALARIA_MODEL")
            .map(str::to_owned)
            .or_else(|| self.model.default.clone())
            .ok_or_else(|| {
                "no model is configured: set `model.default` (and `model.base_url` for a \
                 custom OpenAI-compatible server) in config.yaml, or run `talaria setup`"
                    .to_owned()
            })?;
        let base_url = env
            .get("TALARIA_BASE_URL")
            .map(str::to_owned)
            .or_else(|| self.model.base_url.clone())
            .or_else(|| provider.default_base_url().map(str::to_owned))
            .ok_or_else(|| {
                "provider `custom` needs `model.base_url` in config.yaml, for example \
                 http://127.0.0.1:8080/v1 for llama.cpp"
                    .to_owned()
            })?;
        let api_key = self
            .model
            .api_key
            .clone()
            .or_else(|| key_from_env(provider, env));
        if api_key.is_none() && provider.needs_key() {
            return Err(format!(
                "provider `{}` needs an API key: set `model.api_key` or {}",
                provider.as_str(),
                key_vars(provider)
            ));
        }
        Ok(Endpoint {
            provider,
            model,
            base_url,
            api_key,
        })
    }

    /// The endpoint of `auxiliary.vision`, when one is configured: the
    /// model that looks at images for a main model without vision.
    pub fn vision_endpoint(&self, env: &Env) -> Option<Result<Endpoint, String>> {
        auxiliary_endpoint("auxiliary.vision", self.auxiliary.vision.as_ref()?, env)
    }

    /// The endpoint of `auxiliary.web`, when one is configured: the model
    /// that summarises long pages for `web_extract`.
    pub fn web_endpoint(&self, env: &Env) -> Option<Result<Endpoint, String>> {
        auxiliary_endpoint("auxiliary.web", self.auxiliary.web.as_ref()?, env)
    }

    /// The fallback endpoints in order. Entries that cannot be used (no key)
    /// are skipped with a warning instead of failing the primary.
    pub fn fallback_endpoints(&self, env: &Env) -> (Vec<Endpoint>, Vec<String>) {
        let mut out = Vec::new();
        let mut warnings = Vec::new();
        for (i, f) in self.fallback_providers.iter().enumerate() {
            let base_url = f
                .base_url
                .clone()
                .or_else(|| f.provider.default_base_url().map(str::to_owned));
            let Some(base_url) = base_url else {
                warnings.push(format!(
                    "fallback_providers[{i}] is skipped: provider `custom` needs base_url"
                ));
                continue;
            };
            let api_key = f.api_key.clone().or_else(|| key_from_env(f.provider, env));
            if api_key.is_none() && f.provider.needs_key() {
                warnings.push(format!(
                    "fallback_providers[{i}] is skipped: no api_key and {} is not set",
                    key_vars(f.provider)
                ));
                continue;
            }
            out.push(Endpoint {
                provider: f.provider,
                model: f.model.clone(),
                base_url,
                api_key,
            });
        }
        (out, warnings)
    }

    /// Every secret value written in the file itself: every [`Secret`]
    /// field, wherever it is (found by [`collect_secrets`], so no list of
    /// fields can fall behind the schema), the credentials inside URLs, and
    /// literal MCP credentials (`${VAR}` references are resolved, and
    /// redacted, from the environment instead).
    pub fn secret_values(&self) -> Vec<String> {
        collect_secrets(self)
    }
}

/// Loads `config.yaml` and `.env` from the home. A missing config file is not
/// an error: it means "all defaults".
pub fn load(home: &Home) -> Result<Loaded, ConfigError> {
    let path = home.config_file();
    let env = Env::load(&home.dotenv_file())?;
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => return Err(ConfigError::Read { path, source }),
    };
    let (config, warnings, found) = match &text {
        Some(t) => {
            let (c, w) = Config::parse(t, &path)?;
            (c, w, Some(path))
        }
        None => (Config::default(), Vec::new(), None),
    };
    Ok(Loaded {
        config,
        warnings,
        env,
        path: found,
        text,
    })
}

impl Config {
    /// `web:`, `browser:` and `platform_toolsets:`.
    fn validate_web(&self, invalid: &dyn Fn(&str, &str) -> ConfigError) -> Result<(), ConfigError> {
        let web = &self.web;
        if web.max_bytes == 0 {
            return Err(invalid(
                "web.max_bytes",
                "expected a number of bytes, at least 1",
            ));
        }
        for (key, secs) in [
            ("web.timeout_secs", web.timeout_secs),
            ("browser.idle_timeout_secs", self.browser.idle_timeout_secs),
        ] {
            if secs == 0 {
                return Err(invalid(key, "expected a number of seconds, at least 1"));
            }
        }
        if web.search.max_results == 0 {
            return Err(invalid(
                "web.search.max_results",
                "expected a number of results, at least 1",
            ));
        }
        if web.extract.max_chars < 1000 {
            return Err(invalid(
                "web.extract.max_chars",
                "expected a number of characters, at least 1000",
            ));
        }
        if self.browser.max_contexts == 0 {
            return Err(invalid(
                "browser.max_contexts",
                "expected a number of browser contexts, at least 1",
            ));
        }
        if let Some(u) = &web.search.base_url
            && !is_http_url(u)
        {
            return Err(invalid(
                "web.search.base_url",
                "expected an http:// or https:// URL",
            ));
        }
        if let Some(u) = &self.browser.cdp_url
            && !["ws://", "wss://", "http://", "https://"]
                .iter()
                .any(|p| u.starts_with(p) && u.len() > p.len())
        {
            return Err(invalid(
                "browser.cdp_url",
                "expected a ws://, wss://, http:// or https:// DevTools address",
            ));
        }
        for (i, host) in web.allow_hosts.iter().enumerate() {
            let h = host.trim();
            if !allowed_host_ok(h) {
                return Err(invalid(
                    &format!("web.allow_hosts[{i}]"),
                    "expected a host name, an IP address or a network such as 10.0.0.0/8",
                ));
            }
        }
        for (platform, sets) in &self.platform_toolsets {
            if let Some(bad) = sets.iter().find(|s| !crate::toolsets::is_known(s)) {
                let known: Vec<&str> = crate::toolsets::TOOLSETS.iter().map(|(n, _)| *n).collect();
                return Err(invalid(
                    &format!("platform_toolsets.{platform}"),
                    &format!(
                        "`{bad}` is not a toolset Talaria knows ({}, no_mcp)",
                        known.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// A `web.allow_hosts` entry: a host name, an IP address, or a network in
/// CIDR notation.
fn allowed_host_ok(entry: &str) -> bool {
    if let Some((addr, bits)) = entry.split_once('/') {
        let Ok(bits) = bits.parse::<u8>() else {
            return false;
        };
        return match addr.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(_)) => bits <= 32,
            Ok(std::net::IpAddr::V6(_)) => bits <= 128,
            Err(_) => false,
        };
    }
    !entry.is_empty()
        && entry
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '[' | ']'))
}

/// The endpoint an `auxiliary.<job>` block (`key`) names, or why it can't
/// be used.
fn auxiliary_endpoint(key: &str, m: &ModelConfig, env: &Env) -> Option<Result<Endpoint, String>> {
    let provider = m.provider;
    let Some(model) = m.default.clone() else {
        return Some(Err(format!("`{key}` needs `default`, the model's name")));
    };
    let Some(base_url) = m
        .base_url
        .clone()
        .or_else(|| provider.default_base_url().map(str::to_owned))
    else {
        return Some(Err(format!(
            "`{key}` with provider `custom` needs `base_url`"
        )));
    };
    let api_key = m.api_key.clone().or_else(|| key_from_env(provider, env));
    if api_key.is_none() && provider.needs_key() {
        return Some(Err(format!(
            "`{key}` with provider `{}` needs `api_key` or {}",
            provider.as_str(),
            key_vars(provider)
        )));
    }
    Some(Ok(Endpoint {
        provider,
        model,
        base_url,
        api_key,
    }))
}

/// The provider's key from the first of its variables that is set and
/// not blank (Gemini's key may be under either of two names).
fn key_from_env(provider: ProviderKind, env: &Env) -> Option<Secret> {
    provider
        .api_key_envs()
        .iter()
        .filter_map(|var| env.get(var))
        .find(|v| !v.trim().is_empty())
        .map(Secret::new)
}

/// The provider's key variables as a message names them (`A or B`).
fn key_vars(provider: ProviderKind) -> String {
    provider.api_key_envs().join(" or ")
}
