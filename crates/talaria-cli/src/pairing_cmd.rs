//! `talaria pairing list | approve | revoke | clear-pending`.

use std::process::ExitCode;

use anyhow::bail;
use talaria_gateway::pairing::Pairing;
use talaria_platforms::registry::PLATFORMS;
use talaria_store::gateway::normalize_pairing_code;
use talaria_store::{ApproveOutcome, PairingLimits};

use crate::runtime::Runtime;
use crate::sessions_cmd::when;

/// The platforms of this build on which a stranger can be given a pairing
/// code, as their capabilities say (e-mail, webhooks and Home Assistant
/// identify their senders otherwise).
fn pairing_platforms() -> Vec<&'static str> {
    PLATFORMS
        .iter()
        .filter(|p| p.capabilities.offers_pairing())
        .map(|p| p.name)
        .collect()
}

/// `platform` as pairing stores it, or an error naming the known ones: a
/// typo must not be taken for a wrong code (those count toward the lock).
fn pairing_platform(platform: &str) -> anyhow::Result<String> {
    let name = platform.trim().to_ascii_lowercase();
    let known = pairing_platforms();
    if known.contains(&name.as_str()) {
        Ok(name)
    } else {
        bail!(
            "unknown platform `{platform}`: pairing works on {}",
            known.join(", ")
        )
    }
}

pub async fn list(rt: &Runtime) -> anyhow::Result<ExitCode> {
    let snapshot = rt
        .gateway_store
        .pairing_snapshot(PairingLimits::default())
        .await?;
    if snapshot.pending.is_empty() {
        println!("Pending: none");
    } else {
        println!("Pending (codes are shown only to the user who asked):");
        for p in &snapshot.pending {
            println!(
                "  {:<10} {:<20} {:<20} asked {}",
                p.platform,
                p.user_id,
                p.user_name.as_deref().unwrap_or("-"),
                when(p.created_at)
            );
        }
    }
    if snapshot.approved.is_empty() {
        println!("Approved: none");
    } else {
        println!("Approved:");
        for a in &snapshot.approved {
            println!(
                "  {:<10} {:<20} {:<20} since {}",
                a.platform,
                a.user_id,
                a.user_name.as_deref().unwrap_or("-"),
                when(a.approved_at)
            );
        }
    }
    for (platform, until) in &snapshot.lockouts {
        println!(
            "Locked: approvals on {platform} are locked until {} after repeated wrong codes",
            when(*until)
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn approve(rt: &Runtime, platform: &str, code: &str) -> anyhow::Result<ExitCode> {
    let platform = pairing_platform(platform)?;
    let pairing = Pairing::new(rt.gateway_store.clone());
    match pairing.approve(&platform, code).await? {
        ApproveOutcome::Approved(user) => {
            println!(
                "Approved {} ({}) on {}. They can talk to the bot now.",
                user.user_id,
                user.user_name.as_deref().unwrap_or("no name"),
                user.platform
            );
            // The running gateway finds the approval in the store and says
            // so in their chat; a stopped one does when it next starts.
            println!(
                "The gateway tells them in their chat within seconds (if it is not running, when it next starts)."
            );
            Ok(ExitCode::SUCCESS)
        }
        ApproveOutcome::NoMatch { failures } => {
            let left = PairingLimits::default()
                .max_failures
                .saturating_sub(failures);
            bail!(
                "no pending code {} on {platform} (it may have expired); {left} more wrong attempts lock approvals for an hour",
                // Echoed as it was compared, so a typo is easy to spot.
                normalize_pairing_code(code)
            )
        }
        ApproveOutcome::LockedOut { until } => bail!(
            "{} was not approved: approvals on {platform} are locked until {} after too many \
             wrong codes (a pending code is still accepted, unless so many wrong ones were \
             tried that none is checked until then)",
            normalize_pairing_code(code),
            when(until)
        ),
    }
}

pub async fn revoke(rt: &Runtime, platform: &str, user_id: &str) -> anyhow::Result<ExitCode> {
    let platform = pairing_platform(platform)?;
    if rt.gateway_store.pairing_revoke(&platform, user_id).await? {
        println!("Revoked {user_id} on {platform}.");
        Ok(ExitCode::SUCCESS)
    } else {
        bail!("{user_id} is not approved on {platform}")
    }
}

pub async fn clear_pending(rt: &Runtime, platform: Option<&str>) -> anyhow::Result<ExitCode> {
    let platform = platform.map(pairing_platform).transpose()?;
    let n = rt
        .gateway_store
        .pairing_clear_pending(platform.as_deref())
        .await?;
    let n = usize::try_from(n).unwrap_or(usize::MAX);
    println!(
        "Cleared {}.",
        crate::count(n, "pending code", "pending codes")
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairing_is_offered_on_the_chats_whose_senders_an_operator_approves() {
        assert_eq!(
            pairing_platforms(),
            [
                "telegram",
                "discord",
                "mattermost",
                "matrix",
                "slack",
                "signal",
                "whatsapp_cloud",
                "feishu",
                "sms",
                "dingtalk",
                "qqbot",
                "weixin",
                "yuanbao",
                "wecom_callback",
                "wecom",
                "line",
                "bluebubbles"
            ]
        );
        assert_eq!(pairing_platform(" Telegram ").unwrap(), "telegram");
        for other in ["email", "webhook", "homeassistant", "telgram"] {
            let e = pairing_platform(other).unwrap_err().to_string();
            assert!(e.starts_with(&format!("unknown platform `{other}`")), "{e}");
            assert!(e.contains("telegram, discord"), "{e}");
        }
    }
}
