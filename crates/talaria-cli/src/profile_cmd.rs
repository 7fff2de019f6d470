//! `talaria profile list | create | delete | show`, and `gateway stop
//! --all`: several separate agents on one machine.
//!
//! A profile is nothing but a home, `<home>/profiles/<name>/`, selected
//! with `-p NAME` or `TALARIA_PROFILE`; `default` is the home itself.
//! Everything a home holds (configuration, database, memory, skills, PID
//! file, logs) is the profile's own, so two profiles' gateways run side by
//! side and `gateway stop` stops only the selected one's.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::{Context, bail};
use talaria_core::Home;
use talaria_core::home::DEFAULT_PROFILE;
use talaria_gateway::process;

use crate::cli::ProfileCommand;

/// The home `--home`/`TALARIA_HOME` name (the base) and, with `profile`,
/// the profile's home under it, which must exist already: a typo in `-p`
/// must not quietly start a blank agent.
pub fn select(base: Home, profile: Option<&str>) -> anyhow::Result<Home> {
    let Some(name) = profile.map(str::trim).filter(|n| !n.is_empty()) else {
        return Ok(base);
    };
    let home = base
        .profile(name)
        .map_err(|e| anyhow::anyhow!("`{name}` cannot be a profile name: {e}"))?;
    if name != DEFAULT_PROFILE && !home.root().is_dir() {
        bail!(
            "no profile named `{name}` in {}; `talaria profile create {name}` makes it",
            base.profiles_dir().display()
        );
    }
    Ok(home)
}

/// The systemd unit of a profile's gateway: one per profile, so
/// installing one never replaces another's.
pub fn unit_name(profile: Option<&str>) -> String {
    match profile
        .map(str::trim)
        .filter(|p| !p.is_empty() && *p != DEFAULT_PROFILE)
    {
        Some(name) => format!("talaria-gateway-{name}"),
        None => "talaria-gateway".to_owned(),
    }
}

/// Runs a `profile` command. `base` is the home the profiles live in,
/// `active` the profile in use (for `list`'s mark and `create
/// --copy-config`).
pub fn run(base: &Home, active: &Home, command: ProfileCommand) -> anyhow::Result<ExitCode> {
    match command {
        ProfileCommand::List => list(base, active),
        ProfileCommand::Create { name, copy_config } => create(base, active, &name, copy_config),
        ProfileCommand::Delete { name, yes } => delete(base, &name, yes),
        ProfileCommand::Show { name } => {
            let home = match name {
                Some(name) => select(base.clone(), Some(&name))?,
                None => active.clone(),
            };
            show(base, &home)
        }
    }
}

/// `default` and every folder under `profiles/`, by name.
pub fn all(base: &Home) -> anyhow::Result<Vec<(String, Home)>> {
    let mut out = vec![(DEFAULT_PROFILE.to_owned(), base.clone())];
    let dir = base.profiles_dir();
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("cannot list {}", dir.display())),
    };
    let mut named = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot list {}", dir.display()))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if entry.path().is_dir()
            && let Ok(home) = base.profile(&name)
        {
            named.push((name, home));
        }
    }
    named.sort_by(|a, b| a.0.cmp(&b.0));
    out.extend(named);
    Ok(out)
}

fn gateway_state(home: &Home) -> String {
    match process::running_gateway(home) {
        Some(info) => format!("gateway running (pid {})", info.pid),
        None => "gateway stopped".to_owned(),
    }
}

fn list(base: &Home, active: &Home) -> anyhow::Result<ExitCode> {
    let profiles = all(base)?;
    let width = profiles.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    for (name, home) in &profiles {
        let mark = if home == active { "*" } else { " " };
        println!(
            "{mark} {name:<width$}  {}  ({})",
            home.root().display(),
            gateway_state(home)
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn create(base: &Home, active: &Home, name: &str, copy_config: bool) -> anyhow::Result<ExitCode> {
    if name == DEFAULT_PROFILE {
        bail!("`default` is the home itself and exists already");
    }
    let home = base
        .profile(name)
        .map_err(|e| anyhow::anyhow!("`{name}` cannot be a profile name: {e}"))?;
    if home.root().exists() {
        bail!(
            "the profile `{name}` exists already ({})",
            home.root().display()
        );
    }
    home.ensure()
        .with_context(|| format!("cannot create {}", home.root().display()))?;
    let mut copied = Vec::new();
    if copy_config {
        for (from, to) in [
            (active.config_file(), home.config_file()),
            (active.dotenv_file(), home.dotenv_file()),
        ] {
            if !from.exists() {
                continue;
            }
            std::fs::copy(&from, &to)
                .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
            // Both may hold keys: only the owner reads them, whatever the
            // original's mode was.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600))
                .with_context(|| format!("cannot restrict {}", to.display()))?;
            copied.push(
                to.file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            );
        }
    }
    println!("created the profile `{name}` at {}", home.root().display());
    if !copied.is_empty() {
        println!("  with {} from the profile in use", copied.join(" and "));
    }
    println!("use it with `talaria -p {name} ...` or TALARIA_PROFILE={name}");
    Ok(ExitCode::SUCCESS)
}

fn delete(base: &Home, name: &str, yes: bool) -> anyhow::Result<ExitCode> {
    if name == DEFAULT_PROFILE {
        bail!("`default` is the home itself; it is not deleted by `profile delete`");
    }
    let home = select(base.clone(), Some(name))?;
    if let Some(info) = process::running_gateway(&home) {
        bail!(
            "the profile `{name}`'s gateway is running (pid {}); stop it first with `talaria -p {name} gateway stop`",
            info.pid
        );
    }
    if !yes {
        if !std::io::stdin().is_terminal() {
            bail!(
                "deleting {} removes its conversations, memory and skills; add --yes to confirm",
                home.root().display()
            );
        }
        print!(
            "Delete the profile `{name}` ({}) with its conversations, memory and skills? [y/N] ",
            home.root().display()
        );
        use std::io::Write;
        std::io::stdout().flush().ok();
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            println!("nothing deleted");
            return Ok(ExitCode::FAILURE);
        }
    }
    std::fs::remove_dir_all(home.root())
        .with_context(|| format!("cannot delete {}", home.root().display()))?;
    println!("deleted the profile `{name}`");
    Ok(ExitCode::SUCCESS)
}

fn show(base: &Home, home: &Home) -> anyhow::Result<ExitCode> {
    let name = all(base)?
        .into_iter()
        .find(|(_, h)| h == home)
        .map_or_else(|| "?".to_owned(), |(n, _)| n);
    println!("profile: {name}");
    println!("home: {}", home.root().display());
    match crate::sections::load(home) {
        Ok(loaded) => {
            match loaded.config.primary_endpoint(&loaded.env) {
                Ok(ep) => println!(
                    "model: {} {} at {}",
                    ep.provider.as_str(),
                    ep.model,
                    ep.base_url
                ),
                Err(e) => println!("model: not usable ({e})"),
            }
            let (platforms, _) = crate::config_cmd::platforms_on(home, &loaded.config, &loaded.env);
            if platforms.is_empty() {
                println!("platforms: none");
            } else {
                println!("platforms: {}", platforms.join(", "));
            }
        }
        Err(e) => println!("configuration: cannot be loaded ({e})"),
    }
    println!("{}", gateway_state(home));
    Ok(ExitCode::SUCCESS)
}

/// `gateway stop --all`: every profile's running gateway is asked to stop,
/// all at once (each drains its own turns).
pub async fn stop_all(base: &Home) -> anyhow::Result<ExitCode> {
    let running: Vec<(String, Home)> = all(base)?
        .into_iter()
        .filter(|(_, home)| process::running_gateway(home).is_some())
        .collect();
    if running.is_empty() {
        println!("No profile's gateway is running.");
        return Ok(ExitCode::SUCCESS);
    }
    let stops = running.into_iter().map(|(name, home)| async move {
        println!("{name}: stopping");
        let result = crate::gateway_cmd::stop(home).await;
        (name, result)
    });
    let mut code = ExitCode::SUCCESS;
    for (name, result) in futures::future::join_all(stops).await {
        if let Err(e) = result {
            eprintln!("{name}: {e:#}");
            code = ExitCode::FAILURE;
        }
    }
    Ok(code)
}
