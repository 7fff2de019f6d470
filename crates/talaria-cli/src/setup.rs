//! `talaria setup`: writes `config.yaml` (and the API key into `.env`).

use std::io::{self, BufRead, Write};
use std::process::ExitCode;

use anyhow::{Context, bail};
use serde::Serialize;
use talaria_core::config::Config;
use talaria_core::{Home, ProviderKind};

use crate::cli::SetupArgs;

#[derive(Serialize)]
struct SetupFile {
    model: SetupModel,
    agent: SetupAgent,
}

#[derive(Serialize)]
struct SetupModel {
    default: String,
    provider: ProviderKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    base_url: Option<String>,
}

#[derive(Serialize)]
struct SetupAgent {
    max_turns: u32,
}

fn parse_provider(s: &str) -> anyhow::Result<ProviderKind> {
    match s.trim().to_ascii_lowercase().as_str() {
        "" | "custom" => Ok(ProviderKind::Custom),
        "openai" => Ok(ProviderKind::Openai),
        "openrouter" => Ok(ProviderKind::Openrouter),
        "anthropic" => Ok(ProviderKind::Anthropic),
        other => {
            bail!("unknown provider `{other}`: expected custom, openai, openrouter or anthropic")
        }
    }
}

/// Reads one answer; `None` at end of input.
fn ask(
    input: &mut dyn BufRead,
    question: &str,
    default: Option<&str>,
) -> anyhow::Result<Option<String>> {
    match default {
        Some(d) if !d.is_empty() => eprint!("{question} [{d}]: "),
        _ => eprint!("{question}: "),
    }
    io::stderr().flush()?;
    let mut line = String::new();
    if input.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let line = line.trim();
    Ok(Some(if line.is_empty() {
        default.unwrap_or("").to_owned()
    } else {
        line.to_owned()
    }))
}

pub fn run(home: &Home, args: SetupArgs) -> anyhow::Result<ExitCode> {
    let path = home.config_file();
    if path.exists() && !args.force {
        if args.non_interactive {
            bail!(
                "{} already exists; pass --force to replace it (a backup is kept)",
                path.display()
            );
        }
        let stdin = io::stdin();
        let mut input = stdin.lock();
        let answer = ask(
            &mut input,
            &format!("{} exists. Replace it? (y/N)", path.display()),
            Some("n"),
        )?;
        if !matches!(answer.as_deref(), Some("y" | "Y" | "yes")) {
            eprintln!("left unchanged");
            return Ok(ExitCode::SUCCESS);
        }
    }

    let stdin = io::stdin();
    let mut input = stdin.lock();
    let interactive = !args.non_interactive;

    let provider = match (&args.provider, interactive) {
        (Some(p), _) => parse_provider(p)?,
        (None, false) => ProviderKind::Custom,
        (None, true) => {
            eprintln!(
                "Providers: custom (llama.cpp, vLLM, Ollama, LM Studio, any OpenAI-compatible server), openai, openrouter, anthropic"
            );
            let a = ask(&mut input, "Provider", Some("custom"))?.unwrap_or_default();
            parse_provider(&a)?
        }
    };
    let base_url = match (&args.base_url, interactive, provider) {
        (Some(u), _, _) => Some(u.clone()),
        (None, true, ProviderKind::Custom) => {
            eprintln!(
                "Examples: llama.cpp http://127.0.0.1:8080/v1 · vLLM http://127.0.0.1:8000/v1 · Ollama http://127.0.0.1:11434/v1"
            );
            ask(&mut input, "Base URL", Some("http://127.0.0.1:8080/v1"))?
        }
        (None, false, ProviderKind::Custom) => bail!("provider custom needs --base-url"),
        (None, _, _) => None,
    };
    let model = match (&args.model, interactive) {
        (Some(m), _) => m.clone(),
        (None, false) => bail!("--model is required with --non-interactive"),
        (None, true) => ask(&mut input, "Model name", None)?.unwrap_or_default(),
    };
    if model.trim().is_empty() {
        bail!("a model name is required");
    }
    let api_key = match (&args.api_key, interactive) {
        (Some(k), _) => Some(k.clone()),
        (None, false) => None,
        (None, true) => {
            let hint = if provider == ProviderKind::Custom {
                " (empty for none)"
            } else {
                ""
            };
            ask(&mut input, &format!("API key{hint}"), None)?.filter(|k| !k.is_empty())
        }
    };

    let file = SetupFile {
        model: SetupModel {
            default: model.trim().to_owned(),
            provider,
            base_url: base_url.filter(|u| !u.is_empty()),
        },
        agent: SetupAgent {
            max_turns: Config::default().agent.max_turns,
        },
    };
    let text = format!(
        "# Written by `talaria setup`. Reference: the README's configuration section.\n{}",
        serde_saphyr::to_string(&file)?
    );
    // Validate what we are about to write with the same parser every command uses.
    Config::parse(&text, &path)
        .map_err(|e| anyhow::anyhow!("refusing to write an invalid config: {e}"))?;
    if path.exists() {
        let backup = path.with_extension("yaml.bak");
        std::fs::copy(&path, &backup)
            .with_context(|| format!("cannot back up to {}", backup.display()))?;
        eprintln!("previous config saved to {}", backup.display());
    }
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    if let Some(key) = api_key {
        let var = provider.api_key_env();
        set_dotenv(home, var, &key)?;
        eprintln!("stored {var} in {}", home.dotenv_file().display());
    }
    eprintln!("next: talaria chat");
    Ok(ExitCode::SUCCESS)
}

/// Sets `key=value` in `.env` (replacing an existing line), mode 0600.
fn set_dotenv(home: &Home, key: &str, value: &str) -> anyhow::Result<()> {
    if value.contains(['\n', '\r']) {
        bail!("the API key contains a line break");
    }
    let path = home.dotenv_file();
    let old = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let escaped = value.replace('\\', "\\\\").replace('"', "\\\"");
    let line = format!("{key}=\"{escaped}\"");
    let mut lines: Vec<String> = old
        .lines()
        .filter(|l| !l.trim_start().starts_with(&format!("{key}=")))
        .map(str::to_owned)
        .collect();
    lines.push(line);
    let mut text = lines.join("\n");
    text.push('\n');
    write_private(&path, &text)
}

fn write_private(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        f.write_all(text.as_bytes())?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    #[cfg(not(unix))]
    std::fs::write(path, text)?;
    Ok(())
}
