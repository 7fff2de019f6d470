//! `talaria doctor auth <platform>:<user_id>`: the gateway's authorization
//! of one sender, rule by rule, with the pairing store consulted as the
//! gateway consults it.

use std::process::ExitCode;

use anyhow::{Context, bail};
use talaria_core::Home;
use talaria_gateway::auth::{AuthPolicy, Decision};
use talaria_gateway::event::{ChatType, SessionSource};
use talaria_platforms::registry::PLATFORMS;

/// Who is asked about, and where they write from.
#[derive(Debug, Clone)]
pub struct Sender {
    /// `platform:user_id`, as the user typed it.
    pub who: String,
    /// The chat the message would come from; the user's DM by default.
    pub chat: Option<String>,
    /// The kind of chat.
    pub chat_type: ChatType,
    /// The sender is a bot.
    pub bot: bool,
}

/// Prints the walk through the rules and the verdict. Exits 0 when the
/// sender is let in, 1 when kept out.
pub async fn run(home: &Home, sender: Sender) -> anyhow::Result<ExitCode> {
    let Some((platform, user)) = sender.who.split_once(':') else {
        bail!(
            "`{}` is not <platform>:<user_id> (for example telegram:123456789)",
            sender.who
        );
    };
    let platform = platform.trim().to_ascii_lowercase();
    let user = user.trim();
    if user.is_empty() {
        bail!("the user id after `{platform}:` is empty");
    }
    let Some(entry) = PLATFORMS.iter().find(|p| p.name == platform) else {
        let names: Vec<&str> = PLATFORMS.iter().map(|p| p.name).collect();
        bail!(
            "no platform named `{platform}`; this build knows {}",
            names.join(", ")
        );
    };
    let loaded = crate::sections::load(home)?;
    let caps = entry.capabilities;
    let chat_id = sender.chat.clone().unwrap_or_else(|| user.to_owned());
    let source = SessionSource {
        platform: platform.clone(),
        chat_id,
        chat_name: None,
        chat_type: sender.chat_type,
        user_id: Some(user.to_owned()),
        user_name: None,
        thread_id: None,
        is_bot: sender.bot,
    };
    let policy = AuthPolicy::from_env(&loaded.env);
    // The pairing store is read as the gateway reads it: only for a human
    // the configuration alone keeps out.
    let (mut decision, mut steps) = policy.explain(&source, &caps, false);
    if matches!(decision, Decision::Deny { .. }) && !sender.bot {
        let rt = crate::runtime::Runtime::load_without_model(home.clone()).await?;
        let paired = rt
            .gateway_store
            .pairing_is_approved(&platform, user)
            .await
            .context("cannot read the pairing approvals")?;
        if paired {
            (decision, steps) = policy.explain(&source, &caps, true);
        }
    }
    println!(
        "{} user {user} writing in a {} ({}):",
        entry.title, source.chat_type, source.chat_id
    );
    for (i, step) in steps.iter().enumerate() {
        println!("  {}. {step}", i + 1);
    }
    match decision {
        Decision::Allow(reason) => {
            println!("verdict: let in ({reason})");
            Ok(ExitCode::SUCCESS)
        }
        Decision::Deny { offer_pairing } => {
            if offer_pairing {
                println!(
                    "verdict: kept out; in a DM they are sent a pairing code, which `talaria pairing approve {platform} CODE` accepts"
                );
            } else {
                println!(
                    "verdict: kept out; to let them in, add {user} to {} in {}",
                    talaria_core::config::platform_var(&platform, "ALLOWED_USERS"),
                    home.dotenv_file().display()
                );
            }
            Ok(ExitCode::FAILURE)
        }
    }
}
