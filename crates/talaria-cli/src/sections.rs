//! The sections under `platforms:` and who reads each: every platform in
//! the registry, and the API server. Core keeps them as written; here they
//! are read by their owners' types as soon as the configuration is loaded,
//! so a wrong value in any section (enabled or not) stops a command with
//! its key path and line, and an unknown key is warned about, as for the
//! rest of the file.

use talaria_api::ApiServerConfig;
use talaria_core::config::{self, Checked, ConfigError, Loaded, Origin, PlatformSection};
use talaria_core::effective::{EnvKey, Shown};
use talaria_core::{Config, Home};
use talaria_platforms::registry::PLATFORMS;

/// One section's owner.
struct Owner {
    name: &'static str,
    check: fn(&Config, &Origin<'_>) -> Result<Checked, ConfigError>,
    env: &'static [EnvKey],
}

/// Every section this build reads: the platforms in their registry order,
/// then the API server's.
fn owners() -> Vec<Owner> {
    PLATFORMS
        .iter()
        .map(|p| Owner {
            name: p.name,
            check: p.check,
            env: p.env,
        })
        .chain(std::iter::once(Owner {
            name: ApiServerConfig::NAME,
            check: config::check_section::<ApiServerConfig>,
            env: talaria_api::ENV,
        }))
        .collect()
}

/// [`config::load`], then every section read by its owner: their unknown
/// keys, and the sections nobody reads, join the warnings.
pub fn load(home: &Home) -> Result<Loaded, ConfigError> {
    let mut loaded = config::load(home)?;
    let warnings = check(&loaded)?;
    loaded.warnings.extend(warnings);
    Ok(loaded)
}

/// [`load`] with `text` as the file's contents (the file is not read):
/// what the configuration would be were the file to hold `text`.
pub fn load_text(home: &Home, text: &str) -> Result<Loaded, ConfigError> {
    let path = home.config_file();
    let env = talaria_core::Env::load(&home.dotenv_file())?;
    let (config, warnings) = Config::parse(text, &path)?;
    let mut loaded = Loaded {
        config,
        warnings,
        env,
        path: Some(path),
        text: Some(text.to_owned()),
    };
    let warnings = check(&loaded)?;
    loaded.warnings.extend(warnings);
    Ok(loaded)
}

/// The warnings about `loaded`'s sections, or the first error in one.
fn check(loaded: &Loaded) -> Result<Vec<String>, ConfigError> {
    let origin = loaded.origin();
    let owners = owners();
    let mut warnings = Vec::new();
    for owner in &owners {
        warnings.extend((owner.check)(&loaded.config, &origin)?.warnings);
    }
    for name in loaded.config.platforms.names() {
        if !owners.iter().any(|o| o.name == name) {
            let known: Vec<&str> = owners.iter().map(|o| o.name).collect();
            warnings.push(format!(
                "{}: unknown key `platforms.{name}` (ignored): no platform of this build \
                 has that name; the known ones are {}",
                origin.path.display(),
                known.join(", ")
            ));
        }
    }
    Ok(warnings)
}

/// Every section as its owner reads it, for `talaria config show`.
pub fn shown(loaded: &Loaded) -> Result<Vec<Shown>, ConfigError> {
    let origin = loaded.origin();
    owners()
        .into_iter()
        .map(|owner| {
            let checked = (owner.check)(&loaded.config, &origin)?;
            Ok(Shown {
                name: owner.name,
                value: checked.shown,
                env: owner.env,
            })
        })
        .collect()
}
