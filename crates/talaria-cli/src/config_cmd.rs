//! `talaria config show | check`.

use std::process::ExitCode;
use std::sync::Arc;

use talaria_core::{Config, Home};
use talaria_platforms::registry::{BuildError, PLATFORMS, Setup};
use talaria_store::CursorStore;

/// Prints the effective configuration (file merged over defaults, values
/// from the environment filled in) as YAML, with secrets masked, followed
/// by where those values and the model endpoint come from.
pub fn show(home: &Home) -> anyhow::Result<ExitCode> {
    let loaded = crate::sections::load(home)?;
    for w in &loaded.warnings {
        eprintln!("warning: {w}");
    }
    match &loaded.path {
        Some(p) => println!("# effective configuration from {}", p.display()),
        None => println!(
            "# no {} yet: these are the defaults",
            home.config_file().display()
        ),
    }
    // The file merged over the defaults, with what the environment
    // supplies filled in (masked), so a token kept in .env shows as set.
    let sections = crate::sections::shown(&loaded)?;
    let (tree, from_env) =
        talaria_core::effective::effective(&loaded.config, &loaded.env, &sections);
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
    match loaded.config.primary_endpoint(&loaded.env) {
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
    let (fallbacks, warnings) = loaded.config.fallback_endpoints(&loaded.env);
    for ep in fallbacks {
        println!(
            "#   fallback: {} {} at {}",
            ep.provider.as_str(),
            ep.model,
            ep.base_url
        );
    }
    for w in warnings {
        println!("#   {w}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Validates everything `talaria chat` needs; non-zero exit on any error.
pub fn check(home: &Home) -> anyhow::Result<ExitCode> {
    let loaded = match crate::sections::load(home) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    for w in &loaded.warnings {
        eprintln!("warning: {w}");
    }
    let mut errors = problems(&loaded.config, &loaded.env);
    let (platforms, platform_errors) = platforms_on(home, &loaded.config, &loaded.env);
    errors.extend(platform_errors);
    for e in &errors {
        eprintln!("error: {e}");
    }
    if errors.is_empty() {
        if !platforms.is_empty() {
            println!("platforms: {}", platforms.join(", "));
        }
        let (_, fallback_warnings) = loaded.config.fallback_endpoints(&loaded.env);
        for w in fallback_warnings {
            eprintln!("warning: {w}");
        }
        println!(
            "ok: {}",
            loaded.path.as_ref().map_or_else(
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
    let setup = Setup {
        config,
        env,
        cursors: Arc::new(NoCursors),
        media: talaria_media::MediaCache::for_home(home, &config.media),
    };
    let mut on = Vec::new();
    let mut errors = Vec::new();
    for platform in PLATFORMS {
        match (platform.build)(&setup) {
            Ok(Some(_)) => on.push(platform.name),
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
fn problems(config: &Config, env: &talaria_core::Env) -> Vec<String> {
    let mut out = Vec::new();
    if let Err(e) = config.primary_endpoint(env) {
        out.push(e);
    }
    out
}
