//! `talaria model [NAME]`: what the configured server offers, and setting
//! the default model new conversations use.

use std::process::ExitCode;

use anyhow::Context;
use talaria_core::{Config, Home, ModelRoute};

/// Without a name: the models the configured server lists, the default
/// marked, and the names of `model.routes`. With one: makes it
/// `model.default` (and `model.provider` for `provider:name`) in
/// `config.yaml`.
pub async fn run(home: &Home, name: Option<String>) -> anyhow::Result<ExitCode> {
    let loaded = crate::sections::load(home)?;
    for w in &loaded.warnings {
        eprintln!("warning: {w}");
    }
    match name {
        None => list(&loaded.config, &loaded.env).await,
        Some(name) => set(home, &loaded.config, &loaded.env, &name).await,
    }
}

async fn list(config: &Config, env: &talaria_core::Env) -> anyhow::Result<ExitCode> {
    let endpoint = config.primary_endpoint(env).map_err(anyhow::Error::msg)?;
    let key = endpoint.api_key.as_ref().map(|k| k.expose().to_owned());
    let offered =
        crate::setup::list_models(endpoint.provider, &endpoint.base_url, key.as_deref()).await;
    println!(
        "{} at {} (default: {})",
        endpoint.provider.as_str(),
        endpoint.base_url,
        endpoint.model
    );
    let code = match offered {
        Ok(models) if models.is_empty() => {
            println!("  the server lists no models");
            ExitCode::SUCCESS
        }
        Ok(models) => {
            for m in &models {
                let mark = if *m == endpoint.model { "*" } else { " " };
                println!("{mark} {m}");
            }
            if !models.contains(&endpoint.model) {
                println!("  (the default, {}, is not in this list)", endpoint.model);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cannot list the server's models: {e}");
            ExitCode::FAILURE
        }
    };
    if !config.model.routes.is_empty() {
        println!("named models (model.routes):");
        for (name, route) in &config.model.routes {
            println!("  {name} -> {}", route.spec());
        }
    }
    println!("`talaria model NAME` sets the default; `/model NAME` switches one conversation.");
    Ok(code)
}

async fn set(
    home: &Home,
    config: &Config,
    env: &talaria_core::Env,
    name: &str,
) -> anyhow::Result<ExitCode> {
    let route = ModelRoute::parse(name).map_err(anyhow::Error::msg)?;
    let provider = route.provider.unwrap_or(config.model.provider);
    let path = home.config_file();
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    // The file is edited where the keys stand, so its comments and the
    // rest of its layout stay as the person wrote them.
    let key = |k: &str| vec!["model".to_owned(), k.to_owned()];
    let edit = |text: &str| -> Result<String, String> {
        let mut out = crate::yaml_set::set(text, &key("default"), &route.model.clone().into())?;
        if provider != config.model.provider {
            out = crate::yaml_set::set(&out, &key("provider"), &provider.as_str().into())?;
            // The old server's address and key would send the new
            // provider's requests to the wrong place with the wrong
            // credentials; a provider with a known address needs none, and
            // its key is read from its own variable.
            if provider.default_base_url().is_some() {
                out = crate::yaml_set::remove(&out, &key("base_url"))?;
            }
            out = crate::yaml_set::remove(&out, &key("api_key"))?;
        }
        Ok(out)
    };
    let new_text = edit(&text).map_err(|why| {
        anyhow::anyhow!(
            "cannot change the model in {}: {why}\n(nothing was changed)",
            path.display()
        )
    })?;
    let (parsed, _) = Config::parse(&new_text, &path)
        .map_err(|e| anyhow::anyhow!("the configuration would be invalid: {e}"))?;
    // The new default must be usable as written, or nothing is changed.
    let endpoint = parsed
        .primary_endpoint(env)
        .map_err(|e| anyhow::anyhow!("{e}\n(nothing was changed in {})", path.display()))?;
    let key = endpoint.api_key.as_ref().map(|k| k.expose().to_owned());
    match crate::setup::list_models(endpoint.provider, &endpoint.base_url, key.as_deref()).await {
        Ok(models) if !models.is_empty() && !models.contains(&endpoint.model) => eprintln!(
            "note: {} is not in the server's list ({}); set anyway",
            endpoint.model,
            models.join(", ")
        ),
        Ok(_) => {}
        Err(e) => eprintln!("note: cannot check the server's models ({e}); set anyway"),
    }
    if path.exists() {
        let backup = path.with_extension("yaml.bak");
        std::fs::copy(&path, &backup)
            .with_context(|| format!("cannot back up to {}", backup.display()))?;
        eprintln!("previous config saved to {}", backup.display());
    }
    std::fs::write(&path, new_text).with_context(|| format!("cannot write {}", path.display()))?;
    println!(
        "default model: {} ({}); new conversations use it, a running gateway after a restart",
        endpoint.model,
        endpoint.provider.as_str()
    );
    Ok(ExitCode::SUCCESS)
}
