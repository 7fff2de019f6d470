//! `talaria pairing list | approve | revoke | clear-pending`.

use std::process::ExitCode;

use anyhow::bail;
use talaria_gateway::pairing::Pairing;
use talaria_store::gateway::normalize_pairing_code;
use talaria_store::{ApproveOutcome, PairingLimits};

use crate::runtime::Runtime;
use crate::sessions_cmd::when;

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
    let pairing = Pairing::new(rt.gateway_store.clone());
    match pairing
        .approve(&platform.to_ascii_lowercase(), code)
        .await?
    {
        ApproveOutcome::Approved(user) => {
            println!(
                "Approved {} ({}) on {}. They can talk to the bot now.",
                user.user_id,
                user.user_name.as_deref().unwrap_or("no name"),
                user.platform
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
    if rt
        .gateway_store
        .pairing_revoke(&platform.to_ascii_lowercase(), user_id)
        .await?
    {
        println!("Revoked {user_id} on {platform}.");
        Ok(ExitCode::SUCCESS)
    } else {
        bail!("{user_id} is not approved on {platform}")
    }
}

pub async fn clear_pending(rt: &Runtime, platform: Option<&str>) -> anyhow::Result<ExitCode> {
    let platform = platform.map(str::to_ascii_lowercase);
    let n = rt
        .gateway_store
        .pairing_clear_pending(platform.as_deref())
        .await?;
    println!("Cleared {n} pending code(s).");
    Ok(ExitCode::SUCCESS)
}
