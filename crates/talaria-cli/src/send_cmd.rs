//! `talaria send <target> <text>`: a message to a chat from the command
//! line (scripts, cron, monitoring).
//!
//! With a gateway running, the message goes through its control socket, so
//! it uses the gateway's live connections and its ledger. Without one, this
//! process connects the configured platforms itself, just to send, and
//! records the message in the same ledger: a send cut short here is
//! finished by the next gateway that starts.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use talaria_core::Home;
use talaria_gateway::control::{self, ClientError, Request, Response};
use talaria_gateway::process;
use talaria_gateway::target::Target;

use crate::gateway_cmd;
use crate::runtime::Runtime;

pub async fn run(home: Home, target: &str, words: &[String]) -> anyhow::Result<ExitCode> {
    let text = if words.len() == 1 && words[0] == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read the message from standard input")?;
        text
    } else {
        words.join(" ")
    };
    // A `local` send writes a file; the files there before tell which.
    let local = matches!(target.parse::<Target>(), Ok(Target::Local));
    let before = if local {
        files_under(&home.cron_output_dir())
    } else {
        BTreeSet::new()
    };
    let output_dir = home.cron_output_dir();
    let response = match via_gateway(&home, target, &text).await? {
        Some(response) => response,
        None => {
            let rt = Runtime::load_without_model(home).await?;
            directly(&rt, target, &text).await?
        }
    };
    if response.ok {
        let written: Vec<PathBuf> = if local {
            files_under(&output_dir)
                .difference(&before)
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        match written.as_slice() {
            [path] => println!("wrote {}", path.display()),
            _ => println!("{}", response.detail.unwrap_or_else(|| "sent".into())),
        }
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "talaria: {}",
            response
                .error
                .unwrap_or_else(|| "the message was not sent".into())
        );
        Ok(ExitCode::FAILURE)
    }
}

/// Every file under `dir`, at any depth (none when it does not exist).
fn files_under(dir: &Path) -> BTreeSet<PathBuf> {
    let mut found = BTreeSet::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.file_type() {
                Ok(t) if t.is_dir() => pending.push(entry.path()),
                Ok(t) if t.is_file() => {
                    found.insert(entry.path());
                }
                _ => {}
            }
        }
    }
    found
}

/// Through the running gateway; `None` when no gateway listens.
async fn via_gateway(home: &Home, target: &str, text: &str) -> anyhow::Result<Option<Response>> {
    if process::running_gateway(home).is_none() {
        return Ok(None);
    }
    let request = Request::Send {
        target: target.to_owned(),
        text: text.to_owned(),
    };
    match control::request(&home.gateway_socket(), &request).await {
        Ok(response) => Ok(Some(response)),
        // Still starting, or a gateway from before the socket existed.
        Err(ClientError::NotRunning(_)) => Ok(None),
        Err(e) => Err(e).context("the running gateway did not take the message"),
    }
}

/// Sends as `talaria send` does, for a caller that has loaded the home
/// already (`talaria mcp serve`): through the running gateway, else
/// directly.
pub async fn deliver(rt: &Runtime, target: &str, text: &str) -> anyhow::Result<Response> {
    match via_gateway(&rt.home, target, text).await? {
        Some(response) => Ok(response),
        None => directly(rt, target, text).await,
    }
}

/// Without a gateway: connect what is configured, send, record.
async fn directly(rt: &Runtime, target: &str, text: &str) -> anyhow::Result<Response> {
    let delivery = gateway_cmd::standalone_delivery(rt)?;
    Ok(control::send(&delivery, target, text).await)
}
