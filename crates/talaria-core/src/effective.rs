//! The configuration as it takes effect: `config.yaml` with the values
//! that come from the environment (the process or `$TALARIA_HOME/.env`)
//! filled in where they apply, each marked with where it came from. This
//! is what `talaria config show` prints, so that a token set in `.env`
//! shows as set (masked), not as `null`.

use serde_json::Value;

use crate::config::{Config, Env, mask};

/// A configuration key that an environment variable fills or overrides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvKey {
    /// The key's path, dot-separated: from the top of `config.yaml` in
    /// core's own list, from the top of its section in a section's list
    /// ([`Shown::env`]).
    pub key: &'static str,
    /// The variable.
    pub var: &'static str,
    /// The variable wins over the file (`TALARIA_MODEL`); otherwise it
    /// fills the key only when the file leaves it empty.
    pub overrides: bool,
}

/// The key `key` that `var` fills when the file leaves it empty: what an
/// adapter's `"token from the section, else the variable"` amounts to.
pub const fn fills(key: &'static str, var: &'static str) -> EnvKey {
    EnvKey {
        key,
        var,
        overrides: false,
    }
}

/// The key `key` that `var` sets whatever the file says: a key whose
/// default is always filled in, so only a variable can change it at run
/// time (`WECOM_DM_POLICY`).
pub const fn overrides(key: &'static str, var: &'static str) -> EnvKey {
    EnvKey {
        key,
        var,
        overrides: true,
    }
}

/// The keys outside `platforms:` a variable of a fixed name supplies, as
/// the model client reads them. The model's key variable depends on the
/// provider and is handled apart; the sections under `platforms:` list
/// their own ([`Shown::env`]).
const ENV_KEYS: &[EnvKey] = &[
    EnvKey {
        key: "model.default",
        var: "TALARIA_MODEL",
        overrides: true,
    },
    EnvKey {
        key: "model.base_url",
        var: "TALARIA_BASE_URL",
        overrides: true,
    },
];

/// One section under `platforms:` as its owner reads it, for the tree.
#[derive(Debug, Clone)]
pub struct Shown {
    /// Its key under `platforms:`.
    pub name: &'static str,
    /// Its values with defaults filled in, secrets masked.
    pub value: Value,
    /// The keys of the section (paths from its top) that environment
    /// variables fill.
    pub env: &'static [EnvKey],
}

/// A value the environment supplied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FromEnv {
    /// The key's path in `config.yaml`.
    pub key: String,
    /// The environment variable that supplied it.
    pub var: String,
    /// `.env` or `the environment` (the process's).
    pub origin: &'static str,
    /// The value as shown: masked when it is a credential.
    pub shown: String,
    /// It replaced a value the file set.
    pub overrode: bool,
}

/// The configuration as a tree (secrets masked), with the environment's
/// values in place, and the list of those values. `platforms:` holds the
/// `sections` given, as their owners read them; a section no owner reads
/// is left out, as its keys take no effect.
pub fn effective(config: &Config, env: &Env, sections: &[Shown]) -> (Value, Vec<FromEnv>) {
    let mut tree = serde_json::to_value(config).unwrap_or(Value::Null);
    if let Some(top) = tree.as_object_mut() {
        let platforms = sections
            .iter()
            .map(|s| (s.name.to_owned(), s.value.clone()))
            .collect();
        top.insert("platforms".to_owned(), Value::Object(platforms));
    }
    let mut supplied = Vec::new();
    // The variable the client would read: the first one set (Gemini's
    // key may be under either of two names).
    let provider = config.model.provider;
    let api_key_var = provider
        .api_key_envs()
        .iter()
        .copied()
        .find(|v| env.get(v).is_some())
        .unwrap_or(provider.api_key_env());
    let model_key = EnvKey {
        key: "model.api_key",
        var: api_key_var,
        overrides: false,
    };
    let core = ENV_KEYS
        .iter()
        .chain(std::iter::once(&model_key))
        .map(|e| (e.key.to_owned(), e));
    let of_sections = sections.iter().flat_map(|s| {
        s.env
            .iter()
            .map(|e| (format!("platforms.{}.{}", s.name, e.key), e))
    });
    for (key, entry) in core.chain(of_sections) {
        let Some(value) = env.get(entry.var) else {
            continue;
        };
        let Some(slot) = slot(&mut tree, &key) else {
            continue;
        };
        let set_in_file = !slot.is_null();
        if set_in_file && !entry.overrides {
            continue;
        }
        let shown = if is_credential(&key) {
            mask(value)
        } else {
            value.trim().to_owned()
        };
        *slot = match shown.parse::<u16>() {
            Ok(port) if key.ends_with(".port") => Value::from(port),
            _ => Value::String(shown.clone()),
        };
        supplied.push(FromEnv {
            key,
            var: entry.var.to_owned(),
            origin: env.origin(entry.var),
            shown,
            overrode: set_in_file,
        });
    }
    (tree, supplied)
}

/// The leaf at a dotted path, if the tree has that key.
fn slot<'t>(tree: &'t mut Value, path: &str) -> Option<&'t mut Value> {
    let mut at = tree;
    for part in path.split('.') {
        at = at.as_object_mut()?.get_mut(part)?;
    }
    Some(at)
}

fn is_credential(key: &str) -> bool {
    let last = key.rsplit('.').next().unwrap_or(key);
    ["token", "key", "secret", "password", "sid"]
        .iter()
        .any(|word| last.contains(word))
}

/// Whether every key of `entries` is a leaf of `section` (a section's
/// values with defaults filled in): a key renamed in a section's type but
/// not in its list would silently show nothing. Each owner's tests call
/// this on its own list; the answer names the first key missing.
pub fn missing_env_key(section: &Value, entries: &[EnvKey]) -> Option<&'static str> {
    let mut tree = section.clone();
    entries
        .iter()
        .find(|e| slot(&mut tree, e.key).is_none())
        .map(|e| e.key)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A section as an owner would show it: a token and a server.
    fn example(token: Option<&str>) -> Shown {
        const ENV: &[EnvKey] = &[
            fills("token", "EXAMPLE_TOKEN"),
            fills("server", "EXAMPLE_SERVER"),
            fills("port", "EXAMPLE_PORT"),
        ];
        Shown {
            name: "example",
            value: serde_json::json!({
                "token": token.map(mask),
                "server": null,
                "port": null,
                "retries": 3,
            }),
            env: ENV,
        }
    }

    #[test]
    fn every_listed_key_exists_in_the_configuration() {
        // A key renamed in the schema but not here would silently show
        // nothing: every path must resolve in the default configuration.
        let mut tree = serde_json::to_value(Config::default()).unwrap();
        for entry in ENV_KEYS {
            assert!(slot(&mut tree, entry.key).is_some(), "{}", entry.key);
        }
        let shown = example(None);
        assert_eq!(missing_env_key(&shown.value, shown.env), None);
        assert_eq!(
            missing_env_key(&shown.value, &[fills("tokn", "EXAMPLE_TOKEN")]),
            Some("tokn")
        );
    }

    #[test]
    fn the_environment_fills_empty_keys_masked_and_overrides_the_model() {
        let mut config = Config::default();
        config.model.default = Some("from-file".into());
        let env = Env::from_pairs([
            ("EXAMPLE_TOKEN", "env-token-should-not-win"),
            ("TALARIA_MODEL", "from-env"),
            ("EXAMPLE_SERVER", "https://chat.example.org"),
            ("EXAMPLE_PORT", "8080"),
        ]);
        let sections = [example(Some("file-token-0123456789"))];
        let (tree, supplied) = effective(&config, &env, &sections);
        assert_eq!(tree["platforms"]["example"]["token"], "****6789");
        assert_eq!(tree["model"]["default"], "from-env");
        assert_eq!(
            tree["platforms"]["example"]["server"],
            "https://chat.example.org"
        );
        assert_eq!(tree["platforms"]["example"]["port"], 8080);
        assert_eq!(tree["platforms"]["example"]["retries"], 3);
        let keys: Vec<(&str, bool)> = supplied
            .iter()
            .map(|s| (s.key.as_str(), s.overrode))
            .collect();
        assert_eq!(
            keys,
            [
                ("model.default", true),
                ("platforms.example.server", false),
                ("platforms.example.port", false),
            ]
        );

        // An empty token is filled from the environment, masked.
        let env = Env::from_pairs([("EXAMPLE_TOKEN", "123456:ABCDEFGHIJKLMNOP")]);
        let (tree, supplied) = effective(&config, &env, &[example(None)]);
        assert_eq!(tree["platforms"]["example"]["token"], "****MNOP");
        assert_eq!(supplied[0].key, "platforms.example.token");
        assert!(!format!("{tree}{supplied:?}").contains("ABCDEFGH"));
    }

    #[test]
    fn sections_nobody_reads_are_not_shown() {
        let mut config = Config::default();
        config.platforms.set("nobody.token", "raw-token-0123456789");
        let (tree, _) = effective(&config, &Env::default(), &[example(None)]);
        assert!(tree["platforms"].get("nobody").is_none(), "{tree}");
        assert!(!tree.to_string().contains("raw-token"), "{tree}");
    }
}
