//! `talaria config show | check`, and the same report as JSON for the API
//! server's `GET /api/config`.
//!
//! [`Report::gather`] reads the configuration once and works out
//! everything both commands say; `show` and `check` print their parts of
//! it, and [`Report::to_json`] hands the API the whole of it, so the three
//! never disagree.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use serde_json::{Value, json};
use talaria_core::Endpoint;
use talaria_core::config::ConfigError;
use talaria_core::effective::FromEnv;
use talaria_core::{Config, Home, Redactor};
use talaria_gateway::Adapter;
use talaria_platforms::registry::{BuildError, PLATFORMS, Platform, Setup};
use talaria_store::CursorStore;

/// What `config show` and `config check` say about a home's configuration.
pub struct Report {
    /// Where the configuration file is looked for.
    config_file: PathBuf,
    /// The home's `.env`.
    dotenv_file: PathBuf,
    /// The configuration as loaded and checked, or why it cannot be loaded.
    loaded: Result<Found, ConfigError>,
}

/// The topic of the model endpoint's errors.
const MODEL_TOPIC: &str = "model endpoint";

/// What `config check` says about a configuration that loads.
#[derive(Debug, Clone, Default)]
pub(crate) struct Findings {
    /// What would stop `talaria chat` or the gateway.
    pub errors: Vec<String>,
    /// What each error is about, in the same order: `model endpoint` for
    /// the model's (whose wording changes as it is set up bit by bit),
    /// else the error itself.
    pub topics: Vec<String>,
    /// Keys nothing reads, sections no platform has.
    pub warnings: Vec<String>,
    /// Fallbacks that would be skipped, and why.
    pub notes: Vec<String>,
}

/// The findings about a configuration that loads.
struct Found {
    /// The file read; `None` when there is none and the defaults apply.
    path: Option<PathBuf>,
    /// The warnings of loading (unknown keys, sections nobody reads).
    warnings: Vec<String>,
    /// The effective tree (secrets masked) and the values the environment
    /// supplied, or the error of a section that cannot be read.
    effective: Result<(Value, Vec<FromEnv>), ConfigError>,
    /// The model endpoint, or why there is none usable.
    model: Result<Endpoint, String>,
    /// The fallback endpoints that can be used.
    fallbacks: Vec<Endpoint>,
    /// Why some fallbacks are skipped.
    fallback_warnings: Vec<String>,
    /// What would stop `talaria chat` or the gateway.
    errors: Vec<String>,
    /// What each error is about (see [`Findings::topics`]).
    topics: Vec<String>,
    /// The platforms the configuration turns on.
    platforms: Vec<&'static str>,
    /// The secret values of the configuration and `.env`, to keep out of
    /// the findings' sentences when they leave the process.
    redactor: Redactor,
}

impl Report {
    /// Reads the configuration of `home` as it is on disk now and works
    /// out everything `config show` and `config check` report. Nothing
    /// connects: the platforms are set up as `talaria gateway run` would
    /// set them up, then dropped.
    pub fn gather(home: &Home) -> Report {
        Report::of(home, crate::sections::load(home))
    }

    /// [`Report::gather`] for `text` in place of the file's contents: what
    /// `config check` would say were the file to hold it.
    pub fn of_text(home: &Home, text: &str) -> Report {
        Report::of(home, crate::sections::load_text(home, text))
    }

    fn of(home: &Home, loaded: Result<talaria_core::config::Loaded, ConfigError>) -> Report {
        let loaded = loaded.map(|loaded| {
            let effective = crate::sections::shown(&loaded).map(|sections| {
                talaria_core::effective::effective(&loaded.config, &loaded.env, &sections)
            });
            let model = loaded.config.primary_endpoint(&loaded.env);
            let (fallbacks, fallback_warnings) = loaded.config.fallback_endpoints(&loaded.env);
            let mut errors = problems(&loaded.config, &loaded.env);
            let mut topics = vec![MODEL_TOPIC.to_owned(); errors.len()];
            let (platforms, platform_errors) = platforms_on(home, &loaded.config, &loaded.env);
            topics.extend(platform_errors.iter().cloned());
            errors.extend(platform_errors);
            let redactor = Redactor::new(
                loaded
                    .env
                    .secret_values()
                    .into_iter()
                    .chain(loaded.config.secret_values()),
            );
            Found {
                path: loaded.path,
                warnings: loaded.warnings,
                effective,
                model,
                fallbacks,
                fallback_warnings,
                errors,
                topics,
                platforms,
                redactor,
            }
        });
        Report {
            config_file: home.config_file(),
            dotenv_file: home.dotenv_file(),
            loaded,
        }
    }

    /// What `config check` finds: the error that stops the file loading,
    /// or its findings.
    pub(crate) fn findings(&self) -> Result<Findings, String> {
        match &self.loaded {
            Err(e) => Err(e.to_string()),
            Ok(found) => {
                let mut errors = found.errors.clone();
                let mut topics = found.topics.clone();
                if let Err(e) = &found.effective {
                    errors.push(e.to_string());
                    topics.push(e.to_string());
                }
                Ok(Findings {
                    errors,
                    topics,
                    warnings: found.warnings.clone(),
                    notes: found.fallback_warnings.clone(),
                })
            }
        }
    }

    /// The effective tree (secrets masked) and the values the environment
    /// supplies, when the configuration loads.
    pub(crate) fn effective(&self) -> Result<(&Value, &[FromEnv]), String> {
        match &self.loaded {
            Err(e) => Err(e.to_string()),
            Ok(found) => match &found.effective {
                Ok((tree, from_env)) => Ok((tree, from_env.as_slice())),
                Err(e) => Err(e.to_string()),
            },
        }
    }

    /// The report as `GET /api/config` answers it: `path`, the effective
    /// `config` tree (secrets masked), `from_env`, the `model` endpoint
    /// (its key masked), the `platforms` turned on, and `findings`: the
    /// errors and warnings `talaria config check` prints, each sentence
    /// passed through the redactor in case a value was quoted in one.
    pub fn to_json(&self) -> Value {
        let found = match &self.loaded {
            Ok(found) => found,
            Err(e) => {
                // Without a configuration there are no known secret values
                // but `.env`'s; the credential patterns still apply.
                let env = talaria_core::Env::load(&self.dotenv_file)
                    .map(|env| env.secret_values())
                    .unwrap_or_default();
                let redactor = Redactor::new(env);
                return json!({
                    "path": Value::Null,
                    "config_file": self.config_file.display().to_string(),
                    "config": Value::Null,
                    "from_env": [],
                    "model": Value::Null,
                    "platforms": [],
                    "findings": {
                        "errors": [redactor.redact(&e.to_string())],
                        "warnings": [],
                    },
                });
            }
        };
        let (tree, from_env) = match &found.effective {
            Ok((tree, from_env)) => (tree.clone(), from_env.as_slice()),
            Err(_) => (Value::Null, &[][..]),
        };
        let from_env: Vec<Value> = from_env
            .iter()
            .map(|v| {
                json!({
                    "key": v.key,
                    "var": v.var,
                    "shown": v.shown,
                    "origin": v.origin,
                    "overrode": v.overrode,
                })
            })
            .collect();
        let model = found.model.as_ref().ok().map(|ep| {
            json!({
                "provider": ep.provider.as_str(),
                "model": ep.model,
                "base_url": ep.base_url,
                "api_key": ep.api_key.as_ref().map(|k| k.masked()),
                "fallbacks": found.fallbacks.iter().map(|f| json!({
                    "provider": f.provider.as_str(),
                    "model": f.model,
                    "base_url": f.base_url,
                })).collect::<Vec<_>>(),
            })
        });
        let redact = |lines: Vec<&String>| -> Vec<String> {
            lines
                .into_iter()
                .map(|l| found.redactor.redact(l))
                .collect()
        };
        let errors = redact(found.errors.iter().collect());
        // `check` says why fallbacks are skipped only once nothing is
        // wrong; the findings are what it prints.
        let warnings = if found.errors.is_empty() {
            redact(
                found
                    .warnings
                    .iter()
                    .chain(&found.fallback_warnings)
                    .collect(),
            )
        } else {
            redact(found.warnings.iter().collect())
        };
        json!({
            "path": found.path.as_ref().map(|p| p.display().to_string()),
            "config_file": self.config_file.display().to_string(),
            "config": tree,
            "from_env": from_env,
            "model": model,
            "platforms": found.platforms,
            "findings": {"errors": errors, "warnings": warnings},
        })
    }
}

/// What the API server's `GET /api/config` calls: the report of `home`'s
/// configuration as it is on disk at the time of the request.
pub fn api_report(home: Home) -> Arc<dyn Fn() -> Value + Send + Sync> {
    Arc::new(move || Report::gather(&home).to_json())
}

/// Prints the effective configuration (file merged over defaults, values
/// from the environment filled in) as YAML, with secrets masked, followed
/// by where those values and the model endpoint come from.
pub fn show(home: &Home) -> anyhow::Result<ExitCode> {
    let report = Report::gather(home);
    let found = report.loaded?;
    for w in &found.warnings {
        eprintln!("warning: {w}");
    }
    match &found.path {
        Some(p) => println!("# effective configuration from {}", p.display()),
        None => println!(
            "# no {} yet: these are the defaults",
            report.config_file.display()
        ),
    }
    // The file merged over the defaults, with what the environment
    // supplies filled in (masked), so a token kept in .env shows as set.
    let (tree, from_env) = found.effective?;
    print!("{}", serde_saphyr::to_string(&tree)?);
    if !from_env.is_empty() {
        println!("# from the environment:");
        for v in &from_env {
            println!(
                "#   {} = {} ({} from {}{})",
                v.key,
                v.shown,
                v.var,
                v.origin,
                if v.overrode {
                    ", over the file's value"
                } else {
                    ""
                }
            );
        }
    }
    println!("# resolved model endpoint:");
    match &found.model {
        Ok(ep) => {
            println!(
                "#   {} {} at {} (api key: {})",
                ep.provider.as_str(),
                ep.model,
                ep.base_url,
                ep.api_key
                    .as_ref()
                    .map_or_else(|| "none".to_owned(), |k| k.masked())
            );
        }
        Err(e) => println!("#   not usable: {e}"),
    }
    for ep in &found.fallbacks {
        println!(
            "#   fallback: {} {} at {}",
            ep.provider.as_str(),
            ep.model,
            ep.base_url
        );
    }
    for w in &found.fallback_warnings {
        println!("#   {w}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Validates everything `talaria chat` needs; non-zero exit on any error.
pub fn check(home: &Home) -> anyhow::Result<ExitCode> {
    let found = match Report::gather(home).loaded {
        Ok(found) => found,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    for w in &found.warnings {
        eprintln!("warning: {w}");
    }
    for e in &found.errors {
        eprintln!("error: {e}");
    }
    if found.errors.is_empty() {
        if !found.platforms.is_empty() {
            println!("platforms: {}", found.platforms.join(", "));
        }
        for w in &found.fallback_warnings {
            eprintln!("warning: {w}");
        }
        println!(
            "ok: {}",
            found.path.as_ref().map_or_else(
                || "no config file; defaults apply".to_owned(),
                |p| p.display().to_string()
            )
        );
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::FAILURE)
    }
}

/// Every registered platform the configuration turns on, set up as
/// `talaria gateway run` would (nothing connects), and the errors of those
/// that would stop the gateway.
pub(crate) fn platforms_on(
    home: &talaria_core::Home,
    config: &Config,
    env: &talaria_core::Env,
) -> (Vec<&'static str>, Vec<String>) {
    let (built, errors) = built_platforms(home, config, env);
    (built.into_iter().map(|(p, _)| p.name).collect(), errors)
}

/// A platform set up and its adapter, not connected.
pub(crate) type BuiltPlatform = (&'static Platform, Arc<dyn Adapter>);

/// [`platforms_on`] with the adapters themselves, unconnected: what
/// `talaria doctor` asks whom their credentials belong to.
pub(crate) fn built_platforms(
    home: &talaria_core::Home,
    config: &Config,
    env: &talaria_core::Env,
) -> (Vec<BuiltPlatform>, Vec<String>) {
    let setup = Setup {
        home,
        config,
        env,
        cursors: Arc::new(NoCursors),
        media: talaria_media::MediaCache::for_home(home, &config.media),
        // Only checks what builds: no socket is opened here.
        yuanbao: Default::default(),
    };
    let mut on = Vec::new();
    let mut errors = Vec::new();
    for platform in PLATFORMS {
        match (platform.build)(&setup) {
            Ok(Some(built)) => on.push((platform, built.adapter)),
            Ok(None) => {}
            Err(BuildError::Misconfigured(e)) => {
                errors.push(format!("{} is misconfigured: {e}", platform.title));
            }
            Err(BuildError::SetUp(e)) => {
                errors.push(format!("cannot set up {}: {e}", platform.title));
            }
        }
    }
    (on, errors)
}

/// The cursor store a check hands the constructors: they only keep it for
/// a run, which a check never starts.
struct NoCursors;

#[async_trait::async_trait]
impl CursorStore for NoCursors {
    async fn cursor(&self, _: &str, _: &str) -> talaria_store::Result<Option<String>> {
        Ok(None)
    }

    async fn set_cursor(&self, _: &str, _: &str, _: &str) -> talaria_store::Result<()> {
        Ok(())
    }

    async fn delete_cursor(&self, _: &str, _: &str) -> talaria_store::Result<bool> {
        Ok(false)
    }
}

/// Errors that would stop `talaria chat`.
pub(crate) fn problems(config: &Config, env: &talaria_core::Env) -> Vec<String> {
    let mut out = Vec::new();
    if let Err(e) = config.primary_endpoint(env) {
        out.push(e);
    }
    out
}
