//! `talaria setup`: writes `config.yaml` (the model) and `.env` (the API
//! key, and optionally a Telegram bot with its owner).
//!
//! Interactively, every answer is checked as it is given and asked again
//! when it cannot work; earlier answers are kept as the defaults whenever a
//! question comes round again. Before anything is written the model server
//! is asked for its models, which both tests the connection and offers the
//! models to pick by number; when it cannot be reached, the user fixes the
//! answers or writes them anyway. The API key and the bot token are read
//! with the terminal's echo off.
//!
//! Prompts go to stderr and block this (the main) thread on purpose: the
//! runtime's workers stay free for the model-list request and for the
//! Ctrl-C watcher, which puts the terminal's echo back before exiting.

mod prompt;

use std::io::{self, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;
use talaria_core::config::{Config, Env};
use talaria_core::{Home, ProviderKind};

use crate::cli::SetupArgs;
use prompt::{Prompter, restore_terminal};

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

/// The providers, in the order they are offered.
const PROVIDERS: &[(ProviderKind, &str)] = &[
    (
        ProviderKind::Custom,
        "any OpenAI-compatible server: llama.cpp, vLLM, Ollama, LM Studio, ...",
    ),
    (ProviderKind::Openai, "OpenAI"),
    (ProviderKind::Openrouter, "OpenRouter"),
    (ProviderKind::Anthropic, "Anthropic"),
    (ProviderKind::Gemini, "Google Gemini"),
    (ProviderKind::Deepseek, "DeepSeek"),
    (ProviderKind::Groq, "Groq"),
    (ProviderKind::Mistral, "Mistral"),
    (ProviderKind::Xai, "xAI"),
    (ProviderKind::Together, "Together AI"),
    (ProviderKind::Fireworks, "Fireworks AI"),
    (ProviderKind::Nous, "Nous Portal"),
    (ProviderKind::Ollama, "Ollama on this machine"),
    (ProviderKind::OllamaCloud, "Ollama Cloud"),
    (ProviderKind::Lmstudio, "LM Studio on this machine"),
    (ProviderKind::Vllm, "vLLM on this machine"),
    (ProviderKind::Llamacpp, "llama.cpp on this machine"),
];

/// How long the model server gets to list its models.
const MODELS_TIMEOUT: Duration = Duration::from_secs(10);

/// Models shown by number; a longer list is cut (any name can be typed).
const MODELS_SHOWN: usize = 40;

/// Everything setup writes.
#[derive(Debug, Clone)]
struct Answers {
    provider: ProviderKind,
    /// `None`: the provider's own URL.
    base_url: Option<String>,
    /// A key typed now; `None` keeps whatever `.env` or the environment
    /// holds (or none, for a server without keys).
    api_key: Option<String>,
    model: String,
    telegram: Option<TelegramAnswers>,
}

#[derive(Debug, Clone)]
struct TelegramAnswers {
    /// `None` keeps the token already in `.env`.
    token: Option<String>,
    /// The owner's numeric user id, when they know it.
    owner: Option<String>,
}

fn parse_provider(s: &str) -> Result<ProviderKind, String> {
    let s = s.trim().to_ascii_lowercase();
    if let Ok(n) = s.parse::<usize>() {
        return PROVIDERS
            .get(n.wrapping_sub(1))
            .map(|(p, _)| *p)
            .ok_or_else(|| format!("there is no provider number {n}"));
    }
    ProviderKind::parse(&s).ok_or_else(|| {
        let names: Vec<&str> = PROVIDERS.iter().map(|(p, _)| p.as_str()).collect();
        format!(
            "unknown provider `{s}`: expected a number or one of {}",
            names.join(", ")
        )
    })
}

/// Checks a model server's base URL; the error says what a good one looks
/// like.
fn check_base_url(url: &str) -> Result<String, String> {
    let url = url.trim().trim_end_matches('/');
    if url.is_empty() {
        return Err("a base URL is required (for example http://127.0.0.1:8080/v1)".into());
    }
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!(
            "`{url}` has no scheme: a base URL starts with http:// or https:// \
             (for example http://{url})"
        ));
    }
    match reqwest::Url::parse(url) {
        Ok(u) if u.host_str().is_some_and(|h| !h.is_empty()) => Ok(url.to_owned()),
        _ => Err(format!(
            "`{url}` is not a usable URL (for example http://127.0.0.1:8080/v1)"
        )),
    }
}

/// What @BotFather hands out: the bot's number, a colon, and a secret.
fn check_bot_token(token: &str) -> Result<String, String> {
    let token = token.trim();
    let ok = token.split_once(':').is_some_and(|(id, secret)| {
        !id.is_empty()
            && id.bytes().all(|b| b.is_ascii_digit())
            && secret.len() >= 20
            && secret
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    });
    if ok {
        Ok(token.to_owned())
    } else {
        Err(
            "that does not look like a bot token: @BotFather's look like \
             123456789:AAHk3... (digits, a colon, then letters, digits, - and _)"
                .into(),
        )
    }
}

/// A Telegram user id: a positive number.
fn check_user_id(id: &str) -> Result<String, String> {
    let id = id.trim();
    if !id.is_empty() && id.len() <= 20 && id.bytes().all(|b| b.is_ascii_digit()) {
        Ok(id.to_owned())
    } else {
        Err(format!(
            "`{id}` is not a Telegram user id: it is a number like 123456789 (not your @name)"
        ))
    }
}

pub async fn run(home: &Home, args: SetupArgs) -> anyhow::Result<ExitCode> {
    if args.non_interactive {
        return non_interactive(home, args);
    }
    // Ctrl-C must not leave the terminal without echo.
    tokio::spawn(async {
        if tokio::signal::ctrl_c().await.is_ok() {
            restore_terminal();
            eprintln!("\nsetup cancelled");
            std::process::exit(130);
        }
    });
    let mut prompter = Prompter::stdin();
    let path = home.config_file();
    if path.exists() && !args.force {
        let replace = prompter.confirm(
            &format!("{} exists. Replace it? (a backup is kept)", path.display()),
            false,
        )?;
        if !replace {
            eprintln!("left unchanged");
            return Ok(ExitCode::SUCCESS);
        }
    }
    let env = Env::load(&home.dotenv_file())?;
    let mut answers = Answers {
        provider: match &args.provider {
            Some(p) => parse_provider(p).map_err(anyhow::Error::msg)?,
            None => ProviderKind::Custom,
        },
        base_url: args.base_url.clone(),
        api_key: args.api_key.clone(),
        model: args.model.clone().unwrap_or_default(),
        telegram: None,
    };
    loop {
        model_questions(&mut prompter, &env, &mut answers, args.base_url.as_deref()).await?;
        telegram_questions(&mut prompter, &env, &mut answers)?;
        match write(home, &answers) {
            Ok(()) => break,
            // Not expected (every answer was checked), but the answers are
            // not thrown away: the questions come round again with them.
            Err(e) => {
                eprintln!("These settings cannot be written: {e:#}\nLet's go through them again.")
            }
        }
    }
    next_steps(&answers);
    Ok(ExitCode::SUCCESS)
}

/// The provider, its URL and key, and the model: asked until the server
/// answers with its models, or the user writes the answers anyway.
async fn model_questions(
    prompter: &mut Prompter,
    env: &Env,
    answers: &mut Answers,
    flag_base_url: Option<&str>,
) -> anyhow::Result<()> {
    // Kept across rounds, so switching to a hosted provider and back does
    // not lose the URL typed for the custom server.
    let mut custom_url = answers.base_url.clone();
    // A model server already running here is the likely answer: it becomes
    // the default base URL (the provider's default is already `custom`).
    if custom_url.is_none() && answers.provider == ProviderKind::Custom {
        let found = crate::runtime::find_local_servers().await;
        for server in &found {
            eprintln!("Found: {}", talaria_llm::probe::describe_local(server));
        }
        custom_url = found.first().map(|s| s.base_url.clone());
    }
    // A typed key belongs to the provider it was typed for.
    let mut key_for = answers.provider;
    'answers: loop {
        eprintln!("Providers:");
        for (i, (kind, what)) in PROVIDERS.iter().enumerate() {
            eprintln!("  {}) {:<11} {what}", i + 1, kind.as_str());
        }
        answers.provider = prompter.ask_until(
            "Provider (a number or a name)",
            Some(answers.provider.as_str()),
            parse_provider,
        )?;
        let provider = answers.provider;
        if provider != key_for {
            answers.api_key = None;
            key_for = provider;
        }
        answers.base_url = match provider.default_base_url() {
            // The hosted providers' URL is known; --base-url still applies.
            Some(_) => flag_base_url.map(str::to_owned),
            None => {
                eprintln!(
                    "The server's OpenAI-compatible base URL, for example: llama.cpp \
                     http://127.0.0.1:8080/v1 · vLLM http://127.0.0.1:8000/v1 · Ollama \
                     http://127.0.0.1:11434/v1"
                );
                let default = custom_url
                    .clone()
                    .unwrap_or_else(|| "http://127.0.0.1:8080/v1".to_owned());
                let url = prompter.ask_until("Base URL", Some(&default), check_base_url)?;
                custom_url = Some(url.clone());
                Some(url)
            }
        };
        let var = provider.api_key_env();
        let stored = env.get(var).is_some_and(|k| !k.trim().is_empty());
        let hint = match (&answers.api_key, stored, provider) {
            (Some(_), _, _) => " (hidden; Enter keeps the one you gave)".to_owned(),
            (None, true, _) => format!(" (hidden; Enter keeps {var} from .env)"),
            (None, false, p) if !p.needs_key() => " (hidden; Enter for none)".to_owned(),
            (None, false, _) => " (hidden)".to_owned(),
        };
        let typed = prompter.ask_hidden(&format!("API key{hint}"))?;
        if !typed.is_empty() {
            answers.api_key = Some(typed);
        }
        if provider.needs_key() && answers.api_key.is_none() && !stored {
            eprintln!(
                "  {} needs an API key (it goes into .env as {var}). Paste it, or choose \
                 another provider.",
                provider.as_str()
            );
            continue 'answers;
        }
        let key = answers
            .api_key
            .clone()
            .or_else(|| env.get(var).map(str::to_owned));
        let url = answers
            .base_url
            .clone()
            .or_else(|| provider.default_base_url().map(str::to_owned))
            .unwrap_or_default();
        loop {
            eprintln!("Asking {url} for its models...");
            match list_models(provider, &url, key.as_deref()).await {
                Ok(models) => {
                    answers.model = pick_model(prompter, &models, &answers.model)?;
                    if provider == ProviderKind::Custom {
                        report_probe(&url, &answers.model, key.as_deref()).await;
                    }
                    return Ok(());
                }
                Err(why) => {
                    eprintln!("Cannot list the models at {url}: {why}");
                    eprintln!("Nothing has been written yet.");
                    let choice = prompter.ask_until(
                        "[f]ix the answers, [r]etry, or [w]rite them anyway",
                        Some("f"),
                        |a| match a.to_ascii_lowercase().as_str() {
                            "f" | "fix" => Ok('f'),
                            "r" | "retry" => Ok('r'),
                            "w" | "write" => Ok('w'),
                            _ => Err("answer f, r or w".to_owned()),
                        },
                    )?;
                    match choice {
                        'r' => continue,
                        'w' => {
                            answers.model = pick_model(prompter, &[], &answers.model)?;
                            return Ok(());
                        }
                        _ => continue 'answers,
                    }
                }
            }
        }
    }
}

/// The model: by number from `models`, or any name typed.
fn pick_model(prompter: &mut Prompter, models: &[String], current: &str) -> anyhow::Result<String> {
    if models.is_empty() {
        return prompter.ask_until("Model name", Some(current), |a| {
            if a.trim().is_empty() {
                Err("a model name is required: the name the server knows it by".to_owned())
            } else {
                Ok(a.trim().to_owned())
            }
        });
    }
    eprintln!(
        "The server offers {} model{}:",
        models.len(),
        if models.len() == 1 { "" } else { "s" }
    );
    for (i, m) in models.iter().take(MODELS_SHOWN).enumerate() {
        eprintln!("  {}) {m}", i + 1);
    }
    if models.len() > MODELS_SHOWN {
        eprintln!(
            "  ... and {} more (type a name to use one of them)",
            models.len() - MODELS_SHOWN
        );
    }
    let default = if current.is_empty() {
        "1".to_owned()
    } else {
        current.to_owned()
    };
    let shown = models.len().min(MODELS_SHOWN);
    let chosen = prompter.ask_until("Model (a number or a name)", Some(&default), |a| {
        let a = a.trim();
        if a.is_empty() {
            return Err("a model is required".to_owned());
        }
        match a.parse::<usize>() {
            Ok(n) if (1..=shown).contains(&n) => Ok(models[n - 1].clone()),
            Ok(n) if !models.iter().any(|m| m == a) => {
                Err(format!("there is no model number {n}: pick 1 to {shown}"))
            }
            _ => Ok(a.to_owned()),
        }
    })?;
    if !models.contains(&chosen) {
        eprintln!("  (`{chosen}` is not in the server's list; using it anyway)");
    }
    Ok(chosen)
}

/// Says what the server reports about the chosen model: its context
/// window (used unless `model.context_length` is set) and whether it takes
/// tool calls.
async fn report_probe(url: &str, model: &str, key: Option<&str>) {
    use talaria_llm::probe;
    let info = probe::probe(url, Some(model), key, probe::PROBE_TIMEOUT).await;
    if info.kind == probe::ServerKind::Unknown {
        return;
    }
    let window = match info.context_length {
        Some(n) => format!("a context window of {n} tokens"),
        None => "no context window (the default of model.context_length applies)".to_owned(),
    };
    eprintln!("{} reports {window} for {model}.", info.kind.label());
    match info.tools {
        Some(true) => eprintln!("{model} supports tool calls."),
        Some(false) => eprintln!(
            "Warning: {model} does not support tool calls; Talaria will answer in text only. \
             Choose a model with tool support for commands and file edits."
        ),
        None => {}
    }
}

/// Asks the server for its models: the connection test.
pub(crate) async fn list_models(
    provider: ProviderKind,
    base_url: &str,
    key: Option<&str>,
) -> Result<Vec<String>, String> {
    let base = base_url.trim_end_matches('/');
    // Anthropic's base URL has no version; the OpenAI-compatible ones do.
    let url = if provider.is_anthropic() {
        format!("{base}/v1/models")
    } else {
        format!("{base}/models")
    };
    let client = reqwest::Client::builder()
        .timeout(MODELS_TIMEOUT)
        .build()
        .map_err(|e| format!("cannot set up the request: {e}"))?;
    let mut request = client.get(&url);
    if let Some(key) = key.filter(|k| !k.is_empty()) {
        request = if provider.is_anthropic() {
            request
                .header("x-api-key", key)
                .header("anthropic-version", "2023-06-01")
        } else {
            request.bearer_auth(key)
        };
    }
    let response = request.send().await.map_err(|e| {
        if e.is_timeout() {
            format!("no answer within {} s", MODELS_TIMEOUT.as_secs())
        } else if e.is_connect() {
            "nothing answers there (is the server running, and is the address right?)".to_owned()
        } else {
            format!("the request failed ({e})")
        }
    })?;
    let status = response.status();
    if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
        return Err(format!(
            "the server refused the API key (HTTP {})",
            status.as_u16()
        ));
    }
    if status == reqwest::StatusCode::NOT_FOUND {
        return Err(format!(
            "{url} does not exist (HTTP 404): check the base URL (an OpenAI-compatible one \
             usually ends in /v1)"
        ));
    }
    if !status.is_success() {
        return Err(format!("the server answered HTTP {}", status.as_u16()));
    }
    let body: serde_json::Value = response.json().await.map_err(|_| {
        "the answer is not a model list; is this an OpenAI-compatible server?".to_owned()
    })?;
    let models = body
        .get("data")
        .and_then(|d| d.as_array())
        .ok_or_else(|| {
            "the answer is not a model list; is this an OpenAI-compatible server?".to_owned()
        })?
        .iter()
        .filter_map(|m| m.get("id").and_then(|id| id.as_str()))
        .map(str::to_owned)
        .collect();
    Ok(models)
}

/// Optionally, a Telegram bot: its token, and the owner's user id.
fn telegram_questions(
    prompter: &mut Prompter,
    env: &Env,
    answers: &mut Answers,
) -> anyhow::Result<()> {
    let previous = answers.telegram.clone();
    if !prompter.confirm("Connect a Telegram bot now?", previous.is_some())? {
        answers.telegram = None;
        return Ok(());
    }
    let stored = env
        .get("TELEGRAM_BOT_TOKEN")
        .is_some_and(|t| !t.trim().is_empty());
    let kept = previous.as_ref().and_then(|t| t.token.clone());
    eprintln!("In Telegram, talk to @BotFather and send /newbot; it answers with the bot's token.");
    let token = loop {
        let hint = if kept.is_some() {
            " (hidden; Enter keeps the one you gave)"
        } else if stored {
            " (hidden; Enter keeps TELEGRAM_BOT_TOKEN from .env)"
        } else {
            " (hidden)"
        };
        let typed = prompter.ask_hidden(&format!("Bot token{hint}"))?;
        if typed.is_empty() {
            if kept.is_some() {
                break kept.clone();
            }
            if stored {
                break None;
            }
            eprintln!("  a token is required to connect a bot (or answer n above next time)");
            continue;
        }
        match check_bot_token(&typed) {
            Ok(t) => break Some(t),
            Err(why) => eprintln!("  {why}"),
        }
    };
    eprintln!(
        "Your numeric Telegram user id lets the bot answer you (and only you, until you \
         approve others). If you don't know it, press Enter: once the gateway runs, write to \
         the bot and it answers with your id and a pairing code."
    );
    let known = previous.and_then(|t| t.owner).unwrap_or_default();
    let owner = prompter.ask_until("Your Telegram user id", Some(&known), |a| {
        if a.trim().is_empty() {
            Ok(None)
        } else {
            check_user_id(a).map(Some)
        }
    })?;
    answers.telegram = Some(TelegramAnswers { token, owner });
    Ok(())
}

/// `--non-interactive`: the flags and defaults, checked, nothing asked.
fn non_interactive(home: &Home, args: SetupArgs) -> anyhow::Result<ExitCode> {
    let path = home.config_file();
    if path.exists() && !args.force {
        bail!(
            "{} already exists; pass --force to replace it (a backup is kept)",
            path.display()
        );
    }
    let provider = match &args.provider {
        Some(p) => parse_provider(p).map_err(anyhow::Error::msg)?,
        None => ProviderKind::Custom,
    };
    let base_url = match (&args.base_url, provider) {
        (Some(u), _) => Some(check_base_url(u).map_err(anyhow::Error::msg)?),
        (None, ProviderKind::Custom) => bail!("provider custom needs --base-url"),
        (None, _) => None,
    };
    let model = match args.model.as_deref().map(str::trim) {
        Some(m) if !m.is_empty() => m.to_owned(),
        _ => bail!("--model is required with --non-interactive"),
    };
    let env = Env::load(&home.dotenv_file())?;
    let var = provider.api_key_env();
    if provider.needs_key()
        && args.api_key.as_deref().is_none_or(str::is_empty)
        && env.get(var).is_none_or(|k| k.trim().is_empty())
    {
        bail!(
            "provider {} needs an API key: pass --api-key, or set {var} in {} or the environment",
            provider.as_str(),
            home.dotenv_file().display()
        );
    }
    let telegram = match (&args.telegram_token, &args.telegram_user) {
        (None, None) => None,
        (None, Some(_)) => bail!("--telegram-user needs --telegram-token"),
        (Some(token), owner) => Some(TelegramAnswers {
            token: Some(check_bot_token(token).map_err(anyhow::Error::msg)?),
            owner: owner
                .as_deref()
                .map(check_user_id)
                .transpose()
                .map_err(anyhow::Error::msg)?,
        }),
    };
    let answers = Answers {
        provider,
        base_url,
        api_key: args.api_key.filter(|k| !k.is_empty()),
        model,
        telegram,
    };
    write(home, &answers)?;
    next_steps(&answers);
    Ok(ExitCode::SUCCESS)
}

/// Writes `config.yaml` (a backup of the old one beside it) and the
/// secrets into `.env`.
fn write(home: &Home, answers: &Answers) -> anyhow::Result<()> {
    let path = home.config_file();
    let file = SetupFile {
        model: SetupModel {
            default: answers.model.trim().to_owned(),
            provider: answers.provider,
            base_url: answers.base_url.clone().filter(|u| !u.is_empty()),
        },
        agent: SetupAgent {
            max_turns: Config::default().agent.max_turns,
        },
    };
    let text = format!(
        "# Written by `talaria setup`. Reference: the README's configuration section.\n{}",
        serde_saphyr::to_string(&file)?
    );
    // Checked with the same parser every command uses, before anything is
    // written.
    Config::parse(&text, &path)
        .map_err(|e| anyhow::anyhow!("the configuration would be invalid: {e}"))?;
    let mut vars: Vec<(&str, &str)> = Vec::new();
    if let Some(key) = &answers.api_key {
        vars.push((answers.provider.api_key_env(), key));
    }
    let env = Env::load(&home.dotenv_file())?;
    if let Some(tg) = &answers.telegram {
        if let Some(token) = &tg.token {
            vars.push(("TELEGRAM_BOT_TOKEN", token));
        }
        if let Some(owner) = &tg.owner {
            vars.push(("TELEGRAM_ALLOWED_USERS", owner));
            // Scheduled jobs and `talaria send telegram` go to the owner's
            // chat with the bot, unless a home channel is set already.
            if env.get("TELEGRAM_HOME_CHANNEL").is_none() {
                vars.push(("TELEGRAM_HOME_CHANNEL", owner));
            }
        }
    }
    for (_, value) in &vars {
        if value.contains(['\n', '\r']) {
            bail!("an answer contains a line break");
        }
    }
    if path.exists() {
        let backup = path.with_extension("yaml.bak");
        std::fs::copy(&path, &backup)
            .with_context(|| format!("cannot back up to {}", backup.display()))?;
        eprintln!("previous config saved to {}", backup.display());
    }
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    if !vars.is_empty() {
        set_dotenv(home, &vars)?;
        let names: Vec<&str> = vars.iter().map(|(k, _)| *k).collect();
        eprintln!(
            "stored {} in {}",
            names.join(", "),
            home.dotenv_file().display()
        );
    }
    Ok(())
}

fn next_steps(answers: &Answers) {
    match &answers.telegram {
        None => eprintln!("next: talaria chat"),
        Some(tg) => {
            eprintln!(
                "next: talaria chat, and for Telegram: talaria gateway start \
                 (or talaria gateway install, to run it as a service)"
            );
            if tg.owner.is_none() {
                eprintln!(
                    "Then write to your bot: it answers with your user id and a pairing code; \
                     approve it with: talaria pairing approve telegram <code>"
                );
            }
        }
    }
}

/// Sets each `key=value` in `.env` (replacing existing lines), mode 0600.
fn set_dotenv(home: &Home, vars: &[(&str, &str)]) -> anyhow::Result<()> {
    let path = home.dotenv_file();
    let old = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let mut lines: Vec<String> = old
        .lines()
        .filter(|l| {
            !vars
                .iter()
                .any(|(key, _)| l.trim_start().starts_with(&format!("{key}=")))
        })
        .map(str::to_owned)
        .collect();
    for (key, value) in vars {
        let escaped = value.replace('\\', "\\\\").replace('"', "\\\"");
        lines.push(format!("{key}=\"{escaped}\""));
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_need_a_scheme_and_a_host() {
        assert_eq!(
            check_base_url(" http://127.0.0.1:8080/v1/ ").unwrap(),
            "http://127.0.0.1:8080/v1"
        );
        let why = check_base_url("127.0.0.1:8080/v1").unwrap_err();
        assert!(why.contains("http://127.0.0.1:8080/v1"), "{why}");
        assert!(check_base_url("").is_err());
        assert!(check_base_url("http://").is_err());
        assert!(check_base_url("ftp://host/v1").is_err());
    }

    #[test]
    fn providers_by_number_or_name() {
        assert_eq!(parse_provider("1"), Ok(ProviderKind::Custom));
        assert_eq!(parse_provider(" OpenAI "), Ok(ProviderKind::Openai));
        assert_eq!(parse_provider("4"), Ok(ProviderKind::Anthropic));
        assert!(parse_provider("18").is_err());
        assert_eq!(parse_provider("5"), Ok(ProviderKind::Gemini));
        assert_eq!(
            parse_provider("Ollama-Cloud"),
            Ok(ProviderKind::OllamaCloud)
        );
        assert_eq!(parse_provider("llama.cpp"), Ok(ProviderKind::Llamacpp));
        assert!(parse_provider("0").is_err());
        assert!(parse_provider("").is_err());
        assert!(parse_provider("gemmini").is_err());
    }

    #[test]
    fn bot_tokens_and_user_ids() {
        assert!(check_bot_token("123456789:AAHk3abcdefghijklmnopqrstuvwxyz12").is_ok());
        assert!(check_bot_token("AAHk3abcdefghijklmnopqrstuvwxyz12").is_err());
        assert!(check_bot_token("12:short").is_err());
        assert!(check_user_id("123456789").is_ok());
        assert!(check_user_id("@ann").is_err());
        assert!(check_user_id("-5").is_err());
    }
}
