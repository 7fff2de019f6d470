//! The process environment and the home's `.env`, as one snapshot.

use super::*;

/// Environment variables visible to Talaria: the home's `.env` file with the
/// process environment on top. Kept as a map instead of being written into
/// the process environment, which is not thread-safe to mutate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Env {
    vars: BTreeMap<String, String>,
    /// Keys that came from `.env`; their values are treated as secrets.
    from_file: Vec<String>,
}

impl Env {
    /// The process environment alone.
    pub fn from_process() -> Env {
        Env {
            vars: std::env::vars().collect(),
            from_file: Vec::new(),
        }
    }

    /// `.env` at `path` (if present) overlaid by the process environment.
    pub fn load(path: &Path) -> Result<Env, ConfigError> {
        let mut vars = BTreeMap::new();
        let mut from_file = Vec::new();
        match dotenvy::from_path_iter(path) {
            Ok(iter) => {
                for item in iter {
                    let (k, v) = item.map_err(|e| ConfigError::DotEnv {
                        path: path.to_owned(),
                        message: e.to_string(),
                    })?;
                    from_file.push(k.clone());
                    vars.insert(k, v);
                }
            }
            Err(dotenvy::Error::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(ConfigError::DotEnv {
                    path: path.to_owned(),
                    message: e.to_string(),
                });
            }
        }
        vars.extend(std::env::vars());
        Ok(Env { vars, from_file })
    }

    /// An environment with exactly these variables (for tests).
    pub fn from_pairs<I, K, V>(pairs: I) -> Env
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        Env {
            vars: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            from_file: Vec::new(),
        }
    }

    /// A non-empty variable.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.vars
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// A yes/no variable: `1`, `true`, `yes`, `on` or `0`, `false`, `no`,
    /// `off` (any case); anything else, or unset, is `None`.
    pub fn flag(&self, key: &str) -> Option<bool> {
        match self.get(key)?.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Some(true),
            "0" | "false" | "no" | "off" => Some(false),
            _ => None,
        }
    }

    /// Where variable `key` came from, for people: `.env` when the file
    /// set it and the process did not, else `the environment`.
    pub fn origin(&self, key: &str) -> &'static str {
        if self.from_file.iter().any(|k| k == key) && std::env::var_os(key).is_none() {
            ".env"
        } else {
            "the environment"
        }
    }

    /// Values that must never appear in output: everything loaded from
    /// `.env` and every variable whose name marks it as a credential.
    pub fn secret_values(&self) -> Vec<String> {
        let named_secret = |k: &str| {
            let k = k.to_ascii_uppercase();
            ["KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD"]
                .iter()
                .any(|m| k.contains(m))
        };
        self.vars
            .iter()
            .filter(|(k, _)| self.from_file.contains(k) || named_secret(k))
            .map(|(_, v)| v.clone())
            .filter(|v| v.len() >= 8)
            .collect()
    }
}
