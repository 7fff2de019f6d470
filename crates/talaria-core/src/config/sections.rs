//! `platforms:` as core knows it: each section as written, by name, and the
//! helper that reads one section into the type of whoever owns it.
//!
//! Core does not know which platforms exist. Each section belongs to a
//! front end or an adapter (its crate holds the section's type, defaults
//! and checks); core keeps the YAML as written so that nothing is lost on
//! the way, and [`parse_section`] gives every owner the same messages: an
//! unknown key is a warning naming its full path
//! (`platforms.<name>.<key>`), a value of the wrong form an error naming
//! the key and its line.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::*;

/// `platforms:`: each section as written in the file, by name.
///
/// Secrets in a section are only known by their key's name here (the
/// owner's type holds them as [`Secret`]); so this map's `Debug` shows only
/// the section names, and its serialized form masks every string held
/// under a key that names a credential, except during
/// [`collect_secrets`]'s walk.
#[derive(Clone, PartialEq, Default, Deserialize)]
pub struct PlatformSections(BTreeMap<String, Value>);

impl PlatformSections {
    /// The section named `name`, as written.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name)
    }

    /// The names of the sections the file has.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// Sets one value as the file would: `path` is `<section>.<key>`, with
    /// further dots for nested keys (`example.routes.r.scheme`). Missing
    /// levels are created; a level that holds something other than
    /// settings is replaced by them. For code that builds a configuration
    /// (tests, `talaria setup`) rather than reading one.
    pub fn set(&mut self, path: &str, value: impl Into<Value>) {
        let mut parts = path.split('.');
        let Some(section) = parts.next() else {
            return;
        };
        let keys: Vec<&str> = parts.collect();
        let mut at = self
            .0
            .entry(section.to_owned())
            .or_insert_with(|| Value::Object(Default::default()));
        for key in keys {
            if !at.is_object() {
                *at = Value::Object(Default::default());
            }
            let Value::Object(map) = at else {
                return;
            };
            at = map
                .entry(key.to_owned())
                .or_insert_with(|| Value::Object(Default::default()));
        }
        *at = value.into();
    }
}

impl fmt::Debug for PlatformSections {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The values may hold credentials as plain text: names only.
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl Serialize for PlatformSections {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if revealing() {
            return self.0.serialize(s);
        }
        let masked: BTreeMap<&String, Value> = self
            .0
            .iter()
            .map(|(name, section)| (name, masked_credentials(section, None)))
            .collect();
        masked.serialize(s)
    }
}

/// `value` with every string under a key that names a credential masked.
fn masked_credentials(value: &Value, key: Option<&str>) -> Value {
    match value {
        Value::String(s) if key.is_some_and(|k| names_a_credential(k) && !k.ends_with("_env")) => {
            Value::String(mask(s))
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), masked_credentials(v, Some(k))))
                .collect(),
        ),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|item| masked_credentials(item, key))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// A value a section's type accepted but its owner cannot use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SectionError {
    /// The key, below the section (`base_url`, `routes.gh.secret`).
    pub key: String,
    /// What is wrong, in plain words.
    pub message: String,
}

impl SectionError {
    /// The key `key` below the section is wrong because `message`.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> SectionError {
        SectionError {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// Whether `url` is an `http://` or `https://` URL, which is what every
/// server address in the configuration must be.
pub fn is_http_url(url: &str) -> bool {
    url.starts_with("http://") || url.starts_with("https://")
}

/// The type of one section under `platforms:`, owned by the crate of the
/// front end or adapter it configures.
pub trait PlatformSection: DeserializeOwned + Serialize + Default {
    /// The section's key under `platforms:`.
    const NAME: &'static str;

    /// Checks what the type accepts but the owner cannot use (a URL that
    /// is not one). The default accepts everything.
    fn validate(&self) -> Result<(), SectionError> {
        Ok(())
    }

    /// The section as `config` has it, defaults filled in and checked;
    /// for code that holds a configuration already loaded (and so already
    /// checked with [`parse_section`], where the messages name lines).
    fn read(config: &Config) -> Result<Self, ConfigError> {
        let origin = Origin {
            path: Path::new("config.yaml"),
            text: None,
        };
        parse_section::<Self>(config, &origin).map(|(section, _)| section)
    }
}

impl Config {
    /// The section `T` reads, as [`PlatformSection::read`] gives it; the
    /// type is usually inferred from where the section goes
    /// (`ExampleSettings::from_config(&config.section()?, &env)`).
    pub fn section<T: PlatformSection>(&self) -> Result<T, ConfigError> {
        T::read(self)
    }
}

/// Where a configuration was read from, for messages.
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    /// The file.
    pub path: &'a Path,
    /// Its text, when there is one: with it, errors name their line.
    pub text: Option<&'a str>,
}

impl Loaded {
    /// Where this configuration came from, for [`parse_section`].
    pub fn origin(&self) -> Origin<'_> {
        Origin {
            path: self
                .path
                .as_deref()
                .unwrap_or_else(|| Path::new("config.yaml")),
            text: self.text.as_deref(),
        }
    }
}

/// Reads the section `T::NAME` of `config` into `T`: defaults for what the
/// file leaves out (or for a section it does not have), a warning for each
/// key `T` does not know, and an [`ConfigError::Invalid`] naming the key's
/// full path (and line, when `origin` has the text) for a value of the
/// wrong form or one that [`PlatformSection::validate`] refuses.
pub fn parse_section<T: PlatformSection>(
    config: &Config,
    origin: &Origin<'_>,
) -> Result<(T, Vec<String>), ConfigError> {
    let prefix = format!("platforms.{}", T::NAME);
    let text = origin.text.unwrap_or_default();
    let value = config
        .platforms
        .get(T::NAME)
        .cloned()
        .unwrap_or_else(|| Value::Object(Default::default()));
    let mut unknown = Vec::new();
    let mut on_unknown = |path: serde_ignored::Path<'_>| unknown.push(path.to_string());
    let de = serde_ignored::Deserializer::new(value, &mut on_unknown);
    let section: T = serde_path_to_error::deserialize(de)
        .map_err(|e| yaml_errors::invalid_under(text, origin.path, &prefix, e))?;
    if let Err(e) = section.validate() {
        let invalid = ConfigError::Invalid {
            path: origin.path.to_owned(),
            key: format!("{prefix}.{}", e.key),
            line: None,
            message: e.message,
        };
        return Err(yaml_errors::with_line(text, invalid));
    }
    let warnings = unknown
        .into_iter()
        .map(|k| {
            format!(
                "{}: unknown key `{prefix}.{k}` (ignored)",
                origin.path.display()
            )
        })
        .collect();
    Ok((section, warnings))
}

/// A section read and checked, as `talaria config check` and `config show`
/// need it.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The section with its defaults filled in, secrets masked: what
    /// `config show` prints.
    pub shown: Value,
    /// Its unknown keys, one warning each.
    pub warnings: Vec<String>,
}

/// [`parse_section`] for `T`, kept as what a registry of sections holds
/// (one function pointer per section, whatever its type).
pub fn check_section<T: PlatformSection>(
    config: &Config,
    origin: &Origin<'_>,
) -> Result<Checked, ConfigError> {
    let (section, warnings) = parse_section::<T>(config, origin)?;
    Ok(Checked {
        shown: serde_json::to_value(&section).unwrap_or(Value::Null),
        warnings,
    })
}
